package e2e

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// clusterConfig is the cluster: section of a node that runs the one etcd
// member of a new cluster on free loopback ports; it returns the section and
// the member's client URL.
func clusterEmbedConfig(t *testing.T, name string) (section, clientURL string) {
	clientURL = fmt.Sprintf("http://127.0.0.1:%d", freePort(t))
	return fmt.Sprintf("cluster:\n  name: %s\n  secretFile: %s\n  etcd:\n    embed:\n      peerURL: http://127.0.0.1:%d\n      clientURL: %s\n",
		name, clusterSecret(t), freePort(t), clientURL), clientURL
}

// clusterSecret writes a cluster secret file (mode 600) for the nodes of
// one test and returns its path.
func clusterSecret(t *testing.T) string {
	path := filepath.Join(t.TempDir(), "cluster-secret")
	if err := os.WriteFile(path, []byte(strings.Repeat("e2e-cluster-secret-", 3)), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// One node in cluster mode (its own embedded etcd member) serves the whole
// API end to end, keeps its records in etcd (no bbolt file), and finds them
// again after a restart. A second node pointed at the first node's etcd
// shares its keys and projects: a key made through either works on both, a
// project applied through node 1 runs calls on node 2 (their webhooks
// signed with the team's one secret), a long poll on node 1 wakes when node
// 2 finishes the call, and a revocation through node 1 is refused by node 2
// at once. With node 1 (the one etcd member) stopped, node 2 answers 503
// "cluster unavailable; retry" within the request timeout, and serves again
// once node 1 is back.
func TestClusterModeOnEmbeddedEtcd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	mark := marker()
	section, etcdURL := clusterEmbedConfig(t, "node-1")
	// Node 1's long polls wait 10 minutes, far past the bound on how
	// soon one must be woken, however busy the machine.
	dir1, cfg1 := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\nlongPollWait: 10m\n"+section)
	n1 := startDaemon(t, dir1, cfg1)

	admin := n1.createKey("acme", true)
	key := n1.createKey("acme", false)
	n1.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, mark, "") + "    maxReplicas: 1\n")

	var callID string
	t.Run("a call runs on the single cluster node", func(t *testing.T) {
		r := inferenceClient{t: t, base: n1.base, key: key}.start("mk-echo", `{"prompt":"hello"}`, false)
		if r["message"] != "success" || output(t, r)["echo"].(map[string]any)["prompt"] != "hello" {
			t.Fatalf("start = %v", r)
		}
		callID = r["callID"].(string)
		if _, err := os.Stat(filepath.Join(dir1, "data", "inferd.db")); !os.IsNotExist(err) {
			t.Errorf("cluster mode wrote a bbolt file (stat: %v)", err)
		}
		if _, err := os.Stat(filepath.Join(dir1, "data", "etcd", "member")); err != nil {
			t.Errorf("no etcd member data under dataDir/etcd: %v", err)
		}
	})

	// Restarted here, not in the subtest: a daemon stops when the test
	// that started it ends.
	n1.stop()
	n1 = startDaemon(t, dir1, cfg1)
	t.Run("records and results survive a restart", func(t *testing.T) {
		if callID == "" {
			t.Skip("no call ran")
		}
		r := inferenceClient{t: t, base: n1.base, key: key}.check(callID, false)
		if r["message"] != "success" || output(t, r)["echo"].(map[string]any)["prompt"] != "hello" {
			t.Fatalf("check after restart = %v", r)
		}
		if out, err := n1.cli("project", "list"); err != nil || !strings.Contains(out, "echo") {
			t.Fatalf("project list after restart: %q, %v", out, err)
		}
	})

	dir2, cfg2 := newDaemonDir(t, fmt.Sprintf("startWait: "+scaledSetting(20*time.Second)+"\ncluster:\n  name: node-2\n  secretFile: %s\n  etcd:\n    endpoints: [%s]\n", clusterSecret(t), etcdURL))
	n2 := startDaemon(t, dir2, cfg2)
	auth := func(base, secret string) int {
		status, _ := do(t, "GET", base+"/v1/projects", map[string]string{"X-Service-API-Key": secret}, "")
		return status
	}

	t.Run("keys and projects made through node 1 work on node 2", func(t *testing.T) {
		if s := auth(n2.base, admin); s != http.StatusOK {
			t.Fatalf("node 1's admin key on node 2: HTTP %d", s)
		}
		r := inferenceClient{t: t, base: n2.base, key: key}.start("mk-echo", `{"prompt":"on node 2"}`, false)
		if r["message"] != "success" || output(t, r)["echo"].(map[string]any)["prompt"] != "on node 2" {
			t.Fatalf("start on node 2 = %v", r)
		}
		// The call ran where the project is placed (maxReplicas 1 for the
		// whole cluster): one replica, on one node of the two.
		s1, s2 := n1.replicaStates(key, "echo"), n2.replicaStates(key, "echo")
		if len(s1)+len(s2) != 1 {
			t.Errorf("echo replicas: node 1 %v, node 2 %v; want one in all", s1, s2)
		}
	})

	t.Run("a long poll on node 1 wakes when node 2 finishes the call", func(t *testing.T) {
		body := fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","startOnly":true,"modelInputs":{"sleep":3}}`, key)
		status, r := do(t, "POST", n2.base+"/start/v4", nil, body)
		id, _ := r["callID"].(string)
		if status != http.StatusOK || id == "" {
			t.Fatalf("start on node 2: HTTP %d %v", status, r)
		}
		began := time.Now()
		// One long poll (a 10 min wait): only the completion on node 2,
		// seen through etcd, answers it with the result.
		got := inferenceClient{t: t, base: n1.base, key: key}.check(id, true)
		if got["message"] != "success" {
			t.Fatalf("long poll on node 1 = %v, want success", got)
		}
		if took := time.Since(began); took > testenv.Scale(40*time.Second) {
			t.Errorf("the long poll answered after %v, at the end of its wait rather than at the completion [%s]", took, testenv.Load())
		}
	})

	t.Run("a call on node 2 delivers its webhook, signed with the secret drawn through node 1", func(t *testing.T) {
		out, err := n1.cli("team", "webhook-secret", "acme")
		if err != nil {
			t.Fatal(err)
		}
		rcv := newHookReceiver(t, nil)
		body := fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","startOnly":true,"modelInputs":{"n":2},"webhook":%q}`, key, rcv.url)
		if status, r := do(t, "POST", n2.base+"/start/v4", nil, body); status != http.StatusOK || r["callID"] == "" {
			t.Fatalf("start on node 2: HTTP %d %v", status, r)
		}
		m := rcv.next(t, 60*time.Second)
		verifyStandardWebhook(t, strings.TrimSpace(out), m)
		if !strings.Contains(string(m.body), `"event":"completed"`) {
			t.Errorf("webhook body %s, want the completed event", m.body)
		}
	})

	t.Run("a key made through node 2 works on node 1", func(t *testing.T) {
		k2 := n2.createKey("globex", false)
		if s := auth(n1.base, k2); s != http.StatusOK {
			t.Fatalf("node 2's key on node 1: HTTP %d", s)
		}
	})

	t.Run("a revocation through node 1 is refused on node 2 at once", func(t *testing.T) {
		victim := n1.createKey("initech", false)
		if s := auth(n2.base, victim); s != http.StatusOK {
			t.Fatalf("fresh key on node 2: HTTP %d", s)
		}
		list, err := n1.cli("key", "list", "--team", "initech")
		if err != nil {
			t.Fatal(err)
		}
		id := strings.Fields(strings.Split(strings.TrimSpace(list), "\n")[1])[0]
		if _, err := n1.cli("key", "revoke", id); err != nil {
			t.Fatal(err)
		}
		if s := auth(n2.base, victim); s != http.StatusUnauthorized {
			t.Fatalf("revoked key on node 2: HTTP %d, want 401", s)
		}
	})

	t.Run("both nodes list the same projects", func(t *testing.T) {
		l1, err1 := n1.cli("project", "list")
		l2, err2 := n2.cli("project", "list")
		if err1 != nil || err2 != nil || l1 != l2 || !slices.Contains(strings.Fields(l1), "echo") {
			t.Fatalf("node 1: %q %v\nnode 2: %q %v", l1, err1, l2, err2)
		}
	})

	t.Run("each node's status shows both nodes and one leader", func(t *testing.T) {
		leaders := map[string]bool{}
		for _, n := range []*daemon{n1, n2} {
			status, r := do(t, "GET", n.base+"/v1/status", map[string]string{"X-Service-API-Key": admin}, "")
			c, _ := r["cluster"].(map[string]any)
			nodes, _ := c["nodes"].([]any)
			if status != http.StatusOK || len(nodes) != 2 || c["leader"] == "" {
				t.Fatalf("%s status: HTTP %d, cluster %v; want both nodes and a leader", n.base, status, c)
			}
			leaders[fmt.Sprint(c["leader"])] = true
		}
		if len(leaders) != 1 {
			t.Errorf("the nodes name leaders %v, want one", leaders)
		}
	})

	// Node 1 runs the cluster's one etcd member: stopped, node 2 has no
	// etcd to answer it. Restarted here, not in the subtest (see above).
	n1.stop()
	t.Run("with etcd gone node 2 answers 503 cluster unavailable within the request timeout", func(t *testing.T) {
		if callID == "" {
			t.Skip("no call ran")
		}
		began := time.Now()
		status, r := do(t, "POST", n2.base+"/check/v4", nil, fmt.Sprintf(`{"apiKey":%q,"callID":%q}`, key, callID))
		if status != http.StatusServiceUnavailable || r["message"] != "error: cluster unavailable; retry" {
			t.Errorf("check with etcd gone: HTTP %d %v, want 503 with error: cluster unavailable; retry", status, r)
		}
		if took := time.Since(began); took > testenv.Scale(12*time.Second) {
			t.Errorf("the check answered after %v, want within about the 5 s request timeout [%s]", took, testenv.Load())
		}
		status, r = do(t, "GET", n2.base+"/v1/projects", map[string]string{"X-Service-API-Key": key}, "")
		if e, _ := r["error"].(map[string]any); status != http.StatusServiceUnavailable || e["message"] != "cluster unavailable; retry" {
			t.Errorf("project list with etcd gone: HTTP %d %v, want 503 cluster unavailable; retry", status, r)
		}
	})
	n1 = startDaemon(t, dir1, cfg1)
	t.Run("node 2 serves again once etcd is back", func(t *testing.T) {
		if callID == "" {
			t.Skip("no call ran")
		}
		eventually(t, 60*time.Second, "node 2 answering a check after etcd came back", func() bool {
			status, r, err := tryDo("POST", n2.base+"/check/v4", nil, fmt.Sprintf(`{"apiKey":%q,"callID":%q}`, key, callID))
			return err == nil && status == http.StatusOK && r["message"] == "success"
		})
	})
	n2.stop()
}
