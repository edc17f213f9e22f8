//go:build cluster

package e2e

// The Batch API on three nodes (#42, "the cluster heals"): files and
// batches are reachable through every node, whichever node holds them,
// and a holder that is down is a 503 that says so, never a 404.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// batchNodeGet is GET path through n with key: the status, the raw body
// and the OpenAI error code ("" when none).
func batchNodeGet(t *testing.T, n *clusterNode, key, path string) (int, string, string) {
	t.Helper()
	status, raw := doRaw(t, http.MethodGet, n.base+path, map[string]string{"Authorization": "Bearer " + key}, "")
	var e struct {
		Error struct {
			Code string `json:"code"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &e)
	return status, string(raw), e.Error.Code
}

// listIDs is the ids of a list's data, in order.
func listIDs(t *testing.T, raw string) []string {
	t.Helper()
	var l struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.Unmarshal([]byte(raw), &l); err != nil {
		t.Fatalf("a list that is not JSON: %q", raw)
	}
	var ids []string
	for _, d := range l.Data {
		ids = append(ids, d.ID)
	}
	return ids
}

// Issue 42, the Batch API item: a file uploaded through node-1, a batch of
// it created through node-2, the batch and its output read through node-3
// once it completed; every node lists the same files and batches; a batch
// held by node-2 is cancelled through node-1; and once node-1 is killed
// (kill -9) what it holds is a 503 naming it through the others, never a
// 404, while what the others hold is served as before.
func TestThreeNodeClusterServesTheBatchAPIFromEveryNode(t *testing.T) {
	echo := echoDir(t)
	c := newThreeNodes(t, clusterOpts{})
	n1, n2, n3 := c.nodes[0], c.nodes[1], c.nodes[2]
	admin := n1.d.createKey("acme", true)
	key := n1.d.createKey("acme", false)
	other := n1.d.createKey("globex", false)
	n1.d.apply(fmt.Sprintf("projects:\n  - {id: llm, team: acme, modelKey: mk-llm, command: [\"python3\", \"server.py\"], dir: %s, %s, minReplicas: 1}\n", echo, openaiEcho))
	c.waitLeader(t, admin, time.Minute, c.nodes[:])
	auth := map[string]string{"Authorization": "Bearer " + key}

	// A file uploaded through node-1, a batch of it created through node-2.
	file := uploadedBatchFile(t, n1.d, key, chatBatchLine("a", "llm", "")+chatBatchLine("b", "llm", ""))
	if !strings.HasPrefix(file, "file-node-1.") {
		t.Fatalf("a file uploaded through node-1 is %s, which does not name node-1", file)
	}
	status, b := do(t, http.MethodPost, n2.base+"/v1/batches", auth, createBatchBody(file, ""))
	if status != http.StatusOK {
		t.Fatalf("create through node-2: %d %v", status, b)
	}
	batch, _ := b["id"].(string)

	// Read through node-3 until it completed; its output through node-3.
	var got map[string]any
	eventually(t, 2*time.Minute, "the batch completed, as read through node-3", func() bool {
		status, got = do(t, http.MethodGet, n3.base+"/v1/batches/"+batch, auth, "")
		if status != http.StatusOK {
			t.Fatalf("batch through node-3: %d %v", status, got)
		}
		return got["status"] == "completed" || got["status"] == "failed"
	})
	out, _ := got["output_file_id"].(string)
	if got["status"] != "completed" || out == "" {
		t.Fatalf("the batch ended %v", got)
	}
	status, raw, _ := batchNodeGet(t, n3, key, "/v1/files/"+out+"/content")
	if status != http.StatusOK || strings.Count(raw, "\n") != 2 || !strings.Contains(raw, `"custom_id":"a"`) || !strings.Contains(raw, `"custom_id":"b"`) {
		t.Fatalf("output content through node-3: %d %q", status, raw)
	}
	if status, raw, _ := batchNodeGet(t, n3, other, "/v1/files/"+out); status != http.StatusNotFound {
		t.Errorf("another team's key reads the output through node-3: %d %s, want 404", status, raw)
	}

	// Every node lists the same files and batches.
	for _, path := range []string{"/v1/files", "/v1/batches"} {
		var first []string
		for _, n := range c.nodes {
			status, raw, _ := batchNodeGet(t, n, key, path)
			if status != http.StatusOK {
				t.Fatalf("%s through %s: %d %s", path, n.name, status, raw)
			}
			ids := listIDs(t, raw)
			if first == nil {
				first = ids
			}
			if strings.Join(ids, ",") != strings.Join(first, ",") {
				t.Errorf("%s through %s: %v, through node-1: %v", path, n.name, ids, first)
			}
		}
		t.Logf("%s on every node: %v", path, first)
		if want := map[string]int{"/v1/files": 2, "/v1/batches": 1}[path]; len(first) != want {
			t.Errorf("%s lists %v, want %d", path, first, want)
		}
	}

	// A batch held by node-2 (its file uploaded there), of lines that run
	// a while, created through node-3 and cancelled through node-1.
	slow := uploadedBatchFile(t, n2.d, key, chatBatchLine("s1", "llm", `"sleep": 20`)+chatBatchLine("s2", "llm", `"sleep": 20`))
	status, b = do(t, http.MethodPost, n3.base+"/v1/batches", auth, createBatchBody(slow, ""))
	if status != http.StatusOK || !strings.HasPrefix(b["id"].(string), "batch_node-2.") {
		t.Fatalf("create through node-3 of node-2's file: %d %v", status, b)
	}
	held := b["id"].(string)
	status, b = do(t, http.MethodPost, n1.base+"/v1/batches/"+held+"/cancel", auth, "")
	if status != http.StatusOK || (b["status"] != "cancelling" && b["status"] != "cancelled") {
		t.Fatalf("cancel through node-1: %d %v", status, b)
	}
	eventually(t, time.Minute, "the batch cancelled through node-1 reads cancelled through node-3", func() bool {
		_, b = do(t, http.MethodGet, n3.base+"/v1/batches/"+held, auth, "")
		return b["status"] == "cancelled"
	})

	// node-1 killed: what it holds is a 503 naming it through the others,
	// at once (its address refuses) and once its lease lapsed.
	n1.d.kill()
	heldBy1 := []string{"/v1/files/" + file, "/v1/files/" + out + "/content", "/v1/batches/" + batch}
	check := func(when string) {
		for _, n := range []*clusterNode{n2, n3} {
			for _, path := range heldBy1 {
				status, raw, code := batchNodeGet(t, n, key, path)
				if status != http.StatusServiceUnavailable || code != "node_unavailable" || !strings.Contains(raw, "node node-1") {
					t.Errorf("%s: %s through %s: %d %s, want 503 node_unavailable naming node-1", when, path, n.name, status, raw)
				}
			}
			if status, raw, _ := batchNodeGet(t, n, key, "/v1/batches/"+held); status != http.StatusOK {
				t.Errorf("%s: node-2's batch through %s: %d %s", when, n.name, status, raw)
			}
		}
	}
	check("node-1 just killed")
	// Once node-1's lease lapsed it is no live node: lists are of the live
	// nodes (the same through each), ids it holds still a 503.
	eventually(t, time.Minute, "node-2 lists node-2's batch alone once node-1 is no live node", func() bool {
		status, raw, _ := batchNodeGet(t, n2, key, "/v1/batches")
		return status == http.StatusOK && strings.Join(listIDs(t, raw), ",") == held
	})
	check("node-1's lease lapsed")
	_, raw2, _ := batchNodeGet(t, n2, key, "/v1/files")
	_, raw3, _ := batchNodeGet(t, n3, key, "/v1/files")
	a, b3 := listIDs(t, raw2), listIDs(t, raw3)
	if strings.Join(a, ",") != strings.Join(b3, ",") || !contains(a, slow) || contains(a, file) || contains(a, out) {
		t.Errorf("files through node-2 %v and node-3 %v, want node-2's (%s and its batch's) through each", a, b3, slow)
	}
}
