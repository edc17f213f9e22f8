package config

import (
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestNoClusterSectionIsTheSingleBox(t *testing.T) {
	cfg, err := Load(writeFile(t, "listen: 127.0.0.1:9000\n"), nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster != nil {
		t.Errorf("Cluster = %+v, want nil without a cluster: section", cfg.Cluster)
	}
}

func TestClusterSectionLoads(t *testing.T) {
	path := writeFile(t, `
dataDir: /var/lib/inferd
cluster:
  name: box-1
  advertise: http://10.0.0.1:8080
  secretFile: /etc/inferd/cluster-secret
  etcd:
    dialTimeout: 3s
    embed:
      peerURL: http://10.0.0.1:2380
      clientURL: http://10.0.0.1:2379
      initialCluster: box-1=http://10.0.0.1:2380,box-2=http://10.0.0.2:2380
`)
	cfg, err := Load(path, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	c := cfg.Cluster
	if c == nil || c.Name != "box-1" || c.Etcd.Embed == nil || c.Etcd.Embed.ClientURL != "http://10.0.0.1:2379" ||
		c.Etcd.DialTimeout != 3*time.Second || c.Advertise != "http://10.0.0.1:8080" {
		t.Fatalf("Cluster = %+v", c)
	}
	if got, want := cfg.EtcdDataDir(), filepath.Join("/var/lib/inferd", "etcd"); got != want {
		t.Errorf("EtcdDataDir = %s, want %s", got, want)
	}
}

func TestClusterSectionErrorsNameTheKey(t *testing.T) {
	const embed = "    embed:\n      peerURL: http://127.0.0.1:2380\n      clientURL: http://127.0.0.1:2379\n"
	for _, tc := range []struct {
		name, yaml, want string
	}{
		{"no name", "cluster:\n  etcd:\n" + embed, "cluster.name"},
		{"bad name", "cluster:\n  name: Box_1\n  etcd:\n" + embed, "cluster.name"},
		{"neither endpoints nor embed", "cluster:\n  name: a\n", "set endpoints (an external etcd cluster) or embed"},
		{"both endpoints and embed", "cluster:\n  name: a\n  etcd:\n    endpoints: [http://e:2379]\n" + embed, "not both"},
		{"endpoint not a URL", "cluster:\n  name: a\n  etcd:\n    endpoints: [e:2379]\n", "cluster.etcd.endpoints[0]"},
		{"endpoint without port", "cluster:\n  name: a\n  etcd:\n    endpoints: [http://e]\n", "cluster.etcd.endpoints[0]"},
		{"peerURL missing", "cluster:\n  name: a\n  etcd:\n    embed:\n      clientURL: http://127.0.0.1:2379\n", "cluster.etcd.embed.peerURL"},
		{"https client without cert", "cluster:\n  name: a\n  etcd:\n    embed:\n      peerURL: http://127.0.0.1:2380\n      clientURL: https://127.0.0.1:2379\n", "cluster.etcd.tls"},
		{"https peer without cert", "cluster:\n  name: a\n  etcd:\n    embed:\n      peerURL: https://127.0.0.1:2380\n      clientURL: http://127.0.0.1:2379\n", "cluster.etcd.embed.peerTLS"},
		{"cert without key", "cluster:\n  name: a\n  etcd:\n    endpoints: [https://e:2379]\n    tls:\n      certFile: /c.pem\n", "certFile and keyFile go together"},
		{"join without members", "cluster:\n  name: a\n  etcd:\n" + embed + "      join: true\n", "a joining member needs"},
		{"initialCluster without this member", "cluster:\n  name: a\n  etcd:\n" + embed + "      initialCluster: b=http://127.0.0.2:2380\n", "must list this member"},
		{"initialCluster with another peerURL", "cluster:\n  name: a\n  etcd:\n" + embed + "      initialCluster: a=http://127.0.0.9:2380\n", "but its peerURL is"},
		{"bad prefix", "cluster:\n  name: a\n  etcd:\n    prefix: inferd\n" + embed, "cluster.etcd.prefix"},
		{"bad advertise", "cluster:\n  name: a\n  advertise: 10.0.0.1\n  etcd:\n" + embed, "cluster.advertise"},
		{"no secret", "cluster:\n  name: a\n  etcd:\n" + embed, "cluster.secretFile"},
		{"listening everywhere without advertise", "listen: 0.0.0.0:8080\ncluster:\n  name: a\n  secretFile: /s\n  etcd:\n" + embed, "cluster.advertise"},
		{"unknown key", "cluster:\n  name: a\n  etcd:\n" + embed + "      peerUrl: x\n", "unknown setting(s): cluster.etcd.embed.peerUrl"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load(writeFile(t, tc.yaml), nil, nil)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("Load = %v, want an error containing %q", err, tc.want)
			}
		})
	}
}
