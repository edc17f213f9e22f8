package cli

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"inferd/store/etcd"
)

// secretFileName is the cluster secret init writes beside the certificates.
const secretFileName = "cluster-secret"

// initCluster makes what every node of a new cluster shares (`cluster init
// DIR --hosts ...`): the secret that signs requests between nodes, and the
// TLS files that make etcd answer inferd's nodes alone (docs/cluster.md,
// "etcd is inferd's alone"). It needs no config and talks to no etcd: run
// it once, then copy DIR to every box.
func (c *clusterCommand) initCluster(_ context.Context, args []string) error {
	fs := subFlags("cluster init")
	hostList := fs.String("hosts", "", "every address or host name the members are reached at, comma-separated")
	force := fs.Bool("force", false, "issue a new node certificate over an existing one (the CA and the secret are kept)")
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: cluster init needs exactly one DIR", errUsage)
	}
	var hosts []string
	for _, h := range strings.Split(*hostList, ",") {
		if h = strings.TrimSpace(h); h != "" {
			hosts = append(hosts, h)
		}
	}
	if len(hosts) == 0 {
		return fmt.Errorf("%w: cluster init needs --hosts: every address or host name the etcd members are reached at", errUsage)
	}
	dir, err := filepath.Abs(pos[0])
	if err != nil {
		return err
	}
	files, err := etcd.MakeCerts(dir, hosts, *force, time.Now())
	if err != nil {
		return fmt.Errorf("cluster init: %w", err)
	}
	secret := filepath.Join(dir, secretFileName)
	made, err := writeSecret(secret)
	if err != nil {
		return fmt.Errorf("cluster init: %w", err)
	}
	w := c.env.stdout
	ca := "made"
	if files.CAKept {
		ca = "kept"
	}
	kept := "made"
	if !made {
		kept = "kept"
	}
	fmt.Fprintf(w, "cluster files in %s: CA %s, node certificate for %s, secret %s.\n", dir, ca, strings.Join(hosts, ", "), kept)
	fmt.Fprintf(w, `Copy %[1]s to every box (same path, mode 700, owned by the user inferd runs as);
%[2]s stays on the box that issues certificates. In each node's config
(HOST its own address):

cluster:
  secretFile: %[3]s
  etcd:
    embed:
      peerURL: https://HOST:2380
      clientURL: https://HOST:2379
      peerTLS: {certFile: %[4]s, keyFile: %[5]s, caFile: %[6]s}
    tls: {certFile: %[4]s, keyFile: %[5]s, caFile: %[6]s}
`, dir, files.CAKey, secret, files.Node, files.NodeKey, files.CA)
	return nil
}

// writeSecret writes 32 random bytes, base64, to path (mode 0600) unless
// it exists: a running cluster's secret is never replaced. It reports
// whether it wrote one.
func writeSecret(path string) (bool, error) {
	b := make([]byte, 32)
	rand.Read(b)
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.WriteString(base64.StdEncoding.EncodeToString(b) + "\n"); err != nil {
		f.Close()
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return false, fmt.Errorf("write %s: %w", path, err)
	}
	return true, f.Close()
}
