package e2e

import (
	"time"

	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Operating a cluster with the real binary: a single box's data file
// imported into a running cluster node (its key, project and finished call
// answer there), cluster status and a backup while the node serves, then a
// restore into the node's member (daemon stopped, the old member data moved
// aside): the node starts on it and holds what the backup held, not what
// came after.
func TestClusterImportStatusBackupRestoreWithTheBinary(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	mark := marker()

	// The single box.
	boxDir, boxCfg := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\n")
	box := startDaemon(t, boxDir, boxCfg)
	key := box.createKey("acme", false)
	box.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, mark, "") + "    maxReplicas: 1\n")
	r := inferenceClient{t: t, base: box.base, key: key}.start("mk-echo", `{"prompt":"on the box"}`, false)
	if r["message"] != "success" {
		t.Fatalf("start on the single box = %v", r)
	}
	callID := r["callID"].(string)
	box.stop()

	// The cluster: one node with its own member.
	section, _ := clusterEmbedConfig(t, "node-1")
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\n"+section)
	node := startDaemon(t, dir, cfg)
	out, err := node.cli("cluster", "import", filepath.Join(boxDir, "data", "inferd.db"))
	if err != nil {
		t.Fatalf("cluster import: %v\n%s", err, out)
	}
	auth := func(secret string) int {
		status, _ := do(t, "GET", node.base+"/v1/projects", map[string]string{"X-Service-API-Key": secret}, "")
		return status
	}
	if s := auth(key); s != http.StatusOK {
		t.Errorf("the box's key on the cluster node: HTTP %d\nimport said:\n%s", s, out)
	}
	checkCall := func(step string) {
		t.Helper()
		r := inferenceClient{t: t, base: node.base, key: key}.check(callID, false)
		if r["message"] != "success" || output(t, r)["echo"].(map[string]any)["prompt"] != "on the box" {
			t.Errorf("%s: check of the box's call = %v", step, r)
		}
	}
	checkCall("after import")
	r = inferenceClient{t: t, base: node.base, key: key}.start("mk-echo", `{"prompt":"on the cluster"}`, false)
	if r["message"] != "success" {
		t.Errorf("the box's project on the cluster node: start = %v", r)
	}

	if out, err := node.cli("cluster", "status"); err != nil || !strings.Contains(out, "quorum: yes (1 of 1 voters healthy") {
		t.Errorf("cluster status: %v\n%s", err, out)
	}
	backup := filepath.Join(t.TempDir(), "cluster.snap")
	if out, err := node.cli("cluster", "backup", backup); err != nil {
		t.Fatalf("cluster backup while serving: %v\n%s", err, out)
	}
	later := node.createKey("later", false)
	node.stop()

	member := filepath.Join(dir, "data", "etcd")
	if out, err := node.cli("cluster", "restore", backup); err == nil || !strings.Contains(err.Error(), "exists") {
		t.Errorf("restore over the member's data: %v\n%s; want refused", err, out)
	}
	if err := os.Rename(member, member+".old"); err != nil {
		t.Fatal(err)
	}
	if out, err := node.cli("cluster", "restore", backup); err != nil {
		t.Fatalf("cluster restore: %v\n%s", err, out)
	}
	node = startDaemon(t, dir, cfg)
	if s := auth(key); s != http.StatusOK {
		t.Errorf("the imported key after the restore: HTTP %d", s)
	}
	if s := auth(later); s != http.StatusUnauthorized {
		t.Errorf("a key made after the backup, after the restore: HTTP %d; want 401", s)
	}
	checkCall("after restore")
}
