package cli

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"go.etcd.io/etcd/etcdutl/v3/snapshot"
	"go.uber.org/zap"

	"inferd/config"
)

// restoreToken is the cluster token of a cluster restored from a snapshot
// whose SHA-256 trailer is sum: the same for every member restored from
// that file, so they form one cluster, and unlike the token of the cluster
// the snapshot came from (etcd's default, which store/etcd.StartMember
// starts new clusters with), so the restored cluster has another id and a
// member of the old one that still runs cannot join it by mistake.
func restoreToken(sum string) string { return "inferd-restore-" + sum[:16] }

func (c *clusterCommand) backup(ctx context.Context, args []string) error {
	fs := subFlags("cluster backup")
	force := fs.Bool("force", false, "overwrite FILE if it exists")
	eps := endpointsFlag(fs)
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: cluster backup needs exactly one FILE", errUsage)
	}
	dst := pos[0]
	if _, err := os.Stat(dst); err == nil && !*force {
		return fmt.Errorf("%s exists; pass --force to overwrite it", dst)
	}
	conn, err := c.env.connect(*eps)
	if err != nil {
		return err
	}
	defer conn.close()
	// The snapshot streams the whole database: once it flows it is bounded
	// by the caller's context only, not by the per-request timeout. Its
	// start (a member answering with the first bytes) is bounded as any
	// request, so an unreachable etcd fails within seconds, not never.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	slow := time.AfterFunc(etcdRequestTimeout, cancel)
	resp, err := conn.cli.SnapshotWithVersion(sctx)
	if !slow.Stop() {
		if err == nil {
			resp.Snapshot.Close()
		}
		return fmt.Errorf("cluster backup: no etcd member at %s began the snapshot within %s; if this node's member is down, "+
			"name another member's client URL with --endpoints", strings.Join(conn.cli.Endpoints(), ","), etcdRequestTimeout)
	}
	if err != nil {
		return fmt.Errorf("cluster backup: etcd snapshot: %w", err)
	}
	defer resp.Snapshot.Close()
	var st snapshot.Status
	n, err := replaceChecked(dst, func(w io.Writer) (int64, error) {
		return io.Copy(w, resp.Snapshot)
	}, func(tmp string) (err error) {
		st, _, err = checkSnapshot(tmp)
		return err
	})
	if err != nil {
		return fmt.Errorf("cluster backup: %w", err)
	}
	fmt.Fprintf(c.env.stdout, "cluster backup written to %s (%d bytes, storage version %s, revision %d, %d keys)\n",
		dst, n, resp.Version, st.Revision, st.TotalKey)
	return nil
}

// checkSnapshot checks an etcd snapshot file: the SHA-256 etcd appends to
// the database, then the database itself (etcdutl's snapshot status). It
// returns the status and the SHA-256 (hex).
func checkSnapshot(path string) (st snapshot.Status, sum string, err error) {
	f, err := os.Open(path)
	if err != nil {
		return st, "", err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return st, "", err
	}
	size := fi.Size()
	if size <= sha256.Size {
		return st, "", fmt.Errorf("%s is %d bytes: not an etcd snapshot", path, size)
	}
	h := sha256.New()
	if _, err := io.CopyN(h, f, size-sha256.Size); err != nil {
		return st, "", fmt.Errorf("read %s: %w", path, err)
	}
	want := make([]byte, sha256.Size)
	if _, err := io.ReadFull(f, want); err != nil {
		return st, "", fmt.Errorf("read %s: %w", path, err)
	}
	if !bytes.Equal(h.Sum(nil), want) {
		return st, "", fmt.Errorf("%s: checksum mismatch: the snapshot is damaged", path)
	}
	if st, err = snapshot.NewV3(zap.NewNop()).Status(path); err != nil {
		return st, "", fmt.Errorf("%s: %w", path, err)
	}
	return st, hex.EncodeToString(want), nil
}

func (c *clusterCommand) restore(_ context.Context, args []string) error {
	fs := subFlags("cluster restore")
	dataDir := fs.String("data-dir", "", "the new member's data directory (default: the config's, <dataDir>/etcd)")
	name := fs.String("name", "", "the member's name (default: the config's cluster.name)")
	initial := fs.String("initial-cluster", "", "every member of the restored cluster, NAME=PEERURL,... (default: the config's initialCluster, or this member alone)")
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: cluster restore needs exactly one FILE", errUsage)
	}
	src := pos[0]
	if err := c.restoreDefaults(dataDir, name, initial); err != nil {
		return err
	}
	// Checked here, as a node's config is at its start: a member restored
	// under a name or URL its config would refuse never runs.
	if !config.ValidNodeName(*name) {
		return fmt.Errorf("%w: member name %q must be 1-64 characters of a-z, 0-9 and - (the node's cluster.name)", errUsage, *name)
	}
	peerURL := ""
	for _, m := range strings.Split(*initial, ",") {
		n, u, ok := strings.Cut(strings.TrimSpace(m), "=")
		if !ok || !config.ValidNodeName(n) || checkMemberURL(u) != nil {
			return fmt.Errorf("%w: --initial-cluster: %q is not NAME=http(s)://host:port", errUsage, m)
		}
		if n == *name {
			peerURL = u
		}
	}
	if peerURL == "" {
		return fmt.Errorf("%w: --initial-cluster %q does not list %s=PEERURL", errUsage, *initial, *name)
	}
	_, sum, err := checkSnapshot(src)
	if err != nil {
		return fmt.Errorf("refusing to restore: %w", err)
	}
	if _, err := os.Stat(*dataDir); err == nil {
		return fmt.Errorf("%s exists: stop inferd on this node and move it aside first (restore makes a new member; it never writes over one)", *dataDir)
	}
	err = snapshot.NewV3(zap.NewNop()).Restore(snapshot.RestoreConfig{
		SnapshotPath:        src,
		Name:                *name,
		OutputDataDir:       *dataDir,
		PeerURLs:            []string{peerURL},
		InitialCluster:      *initial,
		InitialClusterToken: restoreToken(sum),
	})
	if err != nil {
		os.RemoveAll(*dataDir) // a half-made directory would be taken for a member's
		return fmt.Errorf("cluster restore: %w", err)
	}
	fmt.Fprintf(c.env.stdout, "restored %s into %s (member %s at %s, cluster %s)\n", src, *dataDir, *name, peerURL, *initial)
	fmt.Fprintln(c.env.stdout, "Restore the same file on every member listed, each with its own --name, then start them all "+
		"(join: false). Nodes' leases in the snapshot lapse: each node registers again when it starts.")
	return nil
}

// restoreDefaults fills restore's flags left empty from the config's
// cluster: section; without one, every flag is needed.
func (c *clusterCommand) restoreDefaults(dataDir, name, initial *string) error {
	var cfg config.Config
	if *dataDir == "" || *name == "" || *initial == "" {
		var err error
		if cfg, err = c.env.clusterConfig(); err != nil {
			return fmt.Errorf("%w (or give --data-dir, --name and --initial-cluster)", err)
		}
	}
	cl := cfg.Cluster
	if *name == "" {
		*name = cl.Name
	}
	if *dataDir == "" {
		if cl.Etcd.Embed == nil {
			return fmt.Errorf("%w: this node runs no etcd member (cluster.etcd.embed): give --data-dir", errUsage)
		}
		*dataDir = cfg.EtcdDataDir()
	}
	if *initial == "" {
		if cl == nil || cl.Etcd.Embed == nil {
			return fmt.Errorf("%w: give --initial-cluster, NAME=PEERURL for each member", errUsage)
		}
		*initial = cl.Etcd.Embed.InitialCluster
		if *initial == "" {
			*initial = cl.Name + "=" + cl.Etcd.Embed.PeerURL
		}
	}
	return nil
}
