package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// In cluster mode the records are in etcd: with no daemon to talk to, the
// admin commands say so and create no bbolt file.
func TestAdminCommandsInClusterModeNeedTheDaemon(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	body := "dataDir: ./data\ncluster:\n  name: n1\n  secretFile: ./secret\n  etcd:\n    endpoints: [http://127.0.0.1:1]\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"key", "list"}, {"project", "list"}, {"key", "create", "--team", "t"}} {
		r := runCLI(t, nil, append([]string{"--config", cfg}, args...)...)
		if r.code != 1 || !strings.Contains(r.stderr, "cluster mode") || !strings.Contains(r.stderr, "inferd serve") {
			t.Errorf("inferd %v: exit %d, stderr %q; want exit 1 saying the daemon must run", args, r.code, r.stderr)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "data", "inferd.db")); !os.IsNotExist(err) {
		t.Errorf("an admin command created a bbolt file in cluster mode (stat: %v)", err)
	}
}

// doctor in cluster mode says where the records are instead of checking a
// bbolt file that is not used.
func TestDoctorInClusterModeSaysTheRecordsAreInEtcd(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	body := "dataDir: ./data\ncluster:\n  name: n1\n  secretFile: ./secret\n  etcd:\n    endpoints: [http://127.0.0.1:1]\n"
	if err := os.WriteFile(cfg, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	r := runCLI(t, nil, "--config", cfg, "doctor")
	if !strings.Contains(r.stdout, "cluster mode (node n1): the records are in etcd") {
		t.Errorf("doctor output lacks the cluster line:\n%s\n%s", r.stdout, r.stderr)
	}
}
