package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"inferd/batches"
	"inferd/cluster"
	"inferd/openai"
	"inferd/store"
)

// batchNodes are two test nodes (node-1, node-2), each with a Batch API
// of its own whose ids name it, that know each other as live.
func batchNodes(t *testing.T) (n1, n2 *testNode) {
	t.Helper()
	nodes := make([]*testNode, 2)
	for i, name := range []string{"node-1", "node-2"} {
		bm, err := batches.New(batches.Config{Dir: t.TempDir(), Log: zerolog.Nop(), Node: name})
		if err != nil {
			t.Fatal(err)
		}
		n := newTestNode(t, name, Options{Batches: bm})
		if _, err := n.env.store.UpdateProject("echo", func(p *store.Project) error { p.Model.Protocol = store.ProtocolOpenAI; return nil }); err != nil {
			t.Fatal(err)
		}
		nodes[i] = n
	}
	for _, n := range nodes {
		for _, o := range nodes {
			n.router.nodes[o.name] = o.info
		}
		n.routing.Nodes = func() []cluster.NodeInfo { return []cluster.NodeInfo{nodes[0].info, nodes[1].info} }
	}
	return nodes[0], nodes[1]
}

// call sends a client's request to n.
func (n *testNode) call(t *testing.T, method, path, body, key string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req, err := http.NewRequest(method, n.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return do(t, req)
}

const echoLine = `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"echo","messages":[]}}`

// A file uploaded through one node is read, listed and deleted through the
// other, which passes each request on to the holder (so the holder checks
// the key: another team's is 404 there, as on a box); a batch is created
// through the node that does not hold its input file and is made where
// the file is.
func TestBatchAPIIdsAreServedThroughEveryNode(t *testing.T) {
	n1, n2 := batchNodes(t)
	rec := n1.call(t, http.MethodPost, "/v1/files", uploadBody(echoLine), keyAcme, "Content-Type", "multipart/form-data; boundary=XB")
	if rec.Code != http.StatusOK {
		t.Fatalf("upload: %d %s", rec.Code, rec.Body)
	}
	f := decode[batches.File](t, rec)
	if got := batches.Holder(f.ID); got != "node-1" {
		t.Fatalf("file %s names holder %q, want node-1", f.ID, got)
	}

	if rec := n2.call(t, http.MethodGet, "/v1/files/"+f.ID, "", keyAcme); rec.Code != http.StatusOK || decode[batches.File](t, rec) != f {
		t.Fatalf("file through node-2: %d %s, want %+v", rec.Code, rec.Body, f)
	}
	if rec := n2.call(t, http.MethodGet, "/v1/files/"+f.ID+"/content", "", keyAcme); rec.Code != http.StatusOK || rec.Body.String() != echoLine {
		t.Fatalf("content through node-2: %d %q", rec.Code, rec.Body)
	}
	if rec := n2.call(t, http.MethodGet, "/v1/files/"+f.ID, "", keyOther); rec.Code != http.StatusNotFound {
		t.Fatalf("another team's key through node-2: %d %s, want 404", rec.Code, rec.Body)
	}
	forwarded := 0
	for _, r := range n1.requests() {
		if strings.HasPrefix(r.path, "/v1/files/") && r.header.Get(cluster.ForwardedHeader) == "node-2" {
			forwarded++
		}
	}
	if forwarded != 3 {
		t.Errorf("node-1 got %d requests forwarded by node-2, want 3", forwarded)
	}

	for _, n := range []*testNode{n1, n2} {
		rec := n.call(t, http.MethodGet, "/v1/files", "", keyAcme)
		l := decode[listPage[batches.File]](t, rec)
		if rec.Code != http.StatusOK || len(l.Data) != 1 || l.Data[0] != f {
			t.Errorf("files through %s: %d %s, want the one file", n.name, rec.Code, rec.Body)
		}
	}

	rec = n2.call(t, http.MethodPost, "/v1/batches", `{"input_file_id":"`+f.ID+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`, keyAcme)
	if rec.Code != http.StatusOK {
		t.Fatalf("create through node-2: %d %s", rec.Code, rec.Body)
	}
	b := decode[batches.Batch](t, rec)
	if got := batches.Holder(b.ID); got != "node-1" {
		t.Fatalf("batch %s names holder %q, want node-1 (where its input is)", b.ID, got)
	}
	for _, n := range []*testNode{n1, n2} {
		rec := n.call(t, http.MethodGet, "/v1/batches/"+b.ID, "", keyAcme)
		if rec.Code != http.StatusOK || decode[batches.Batch](t, rec).ID != b.ID {
			t.Errorf("batch through %s: %d %s", n.name, rec.Code, rec.Body)
		}
		rec = n.call(t, http.MethodGet, "/v1/batches", "", keyAcme)
		l := decode[listPage[batches.Batch]](t, rec)
		if rec.Code != http.StatusOK || len(l.Data) != 1 || l.Data[0].ID != b.ID {
			t.Errorf("batches through %s: %d %s, want the one batch", n.name, rec.Code, rec.Body)
		}
		rec = n.call(t, http.MethodGet, "/v1/batches", "", keyOther)
		if l := decode[listPage[batches.Batch]](t, rec); rec.Code != http.StatusOK || len(l.Data) != 0 {
			t.Errorf("another team's batches through %s: %d %s, want none", n.name, rec.Code, rec.Body)
		}
	}
	if rec := n2.call(t, http.MethodPost, "/v1/batches/"+b.ID+"/cancel", "", keyAcme); rec.Code != http.StatusOK {
		t.Fatalf("cancel through node-2: %d %s", rec.Code, rec.Body)
	}

	// A second file, on node-2: each list holds both, newest first, alike.
	rec = n2.call(t, http.MethodPost, "/v1/files", uploadBody(echoLine), keyAcme, "Content-Type", "multipart/form-data; boundary=XB")
	g := decode[batches.File](t, rec)
	var lists [2]string
	for i, n := range []*testNode{n1, n2} {
		rec := n.call(t, http.MethodGet, "/v1/files?purpose=batch", "", keyAcme)
		l := decode[listPage[batches.File]](t, rec)
		if len(l.Data) != 2 || !(l.Data[0].ID == g.ID || l.Data[0].CreatedAt == l.Data[1].CreatedAt) {
			t.Errorf("files through %s: %s, want %s and %s", n.name, rec.Body, g.ID, f.ID)
		}
		lists[i] = rec.Body.String()
	}
	if lists[0] != lists[1] {
		t.Errorf("the lists differ:\n%s\n%s", lists[0], lists[1])
	}

	if rec := n2.call(t, http.MethodDelete, "/v1/files/"+g.ID, "", keyAcme); rec.Code != http.StatusOK {
		t.Fatalf("delete node-2's own file: %d %s", rec.Code, rec.Body)
	}
	if rec := n1.call(t, http.MethodGet, "/v1/files/"+g.ID, "", keyAcme); rec.Code != http.StatusNotFound {
		t.Errorf("a deleted file through node-1: %d %s, want 404", rec.Code, rec.Body)
	}
}

// unavailableHolder checks a 503 that names node as unavailable, in
// OpenAI's shape, with a Retry-After.
func unavailableHolder(t *testing.T, rec *httptest.ResponseRecorder, node string) {
	t.Helper()
	var body openai.ErrorBody
	_ = json.Unmarshal(rec.Body.Bytes(), &body)
	if rec.Code != http.StatusServiceUnavailable || body.Error.Code == nil || *body.Error.Code != "node_unavailable" ||
		!strings.Contains(body.Error.Message, "node "+node) || rec.Header().Get("Retry-After") == "" {
		t.Errorf("got %d %s (Retry-After %q), want 503 node_unavailable naming node %s", rec.Code, rec.Body, rec.Header().Get("Retry-After"), node)
	}
}

// An id held by a node that is not live, or that does not answer, is a 503
// naming that node (retry), never a 404; a list with a live node that does
// not answer is a 503 too, not a list without that node's part.
func TestBatchAPIIdOfAnUnavailableNodeIs503(t *testing.T) {
	n1, n2 := batchNodes(t)
	rec := n1.call(t, http.MethodPost, "/v1/files", uploadBody(echoLine), keyAcme, "Content-Type", "multipart/form-data; boundary=XB")
	f := decode[batches.File](t, rec)

	n2.router.mu.Lock()
	delete(n2.router.nodes, "node-1") // its lease ended
	n2.router.mu.Unlock()
	for _, tc := range []struct{ method, path, body string }{
		{http.MethodGet, "/v1/files/" + f.ID, ""},
		{http.MethodGet, "/v1/files/" + f.ID + "/content", ""},
		{http.MethodDelete, "/v1/files/" + f.ID, ""},
		{http.MethodPost, "/v1/batches", `{"input_file_id":"` + f.ID + `","endpoint":"/v1/chat/completions","completion_window":"24h"}`},
		{http.MethodGet, "/v1/batches/batch_node-1.0123456789abcdef01234567", ""},
		{http.MethodPost, "/v1/batches/batch_node-1.0123456789abcdef01234567/cancel", ""},
	} {
		t.Run(tc.method+" "+tc.path, func(t *testing.T) {
			unavailableHolder(t, n2.call(t, tc.method, tc.path, tc.body, keyAcme), "node-1")
		})
	}

	dead := deadNode(t, "node-1") // live, as far as node-2 knows, but not answering
	n2.router.mu.Lock()
	n2.router.nodes["node-1"] = dead
	n2.router.mu.Unlock()
	unavailableHolder(t, n2.call(t, http.MethodGet, "/v1/files/"+f.ID, "", keyAcme), "node-1")
	n2.routing.Nodes = func() []cluster.NodeInfo { return []cluster.NodeInfo{dead, n2.info} }
	unavailableHolder(t, n2.call(t, http.MethodGet, "/v1/files", "", keyAcme), "node-1")
	unavailableHolder(t, n2.call(t, http.MethodGet, "/v1/batches", "", keyAcme), "node-1")
}

// The list route between nodes answers only requests signed by a node of
// the cluster, as all of /cluster/v1/.
func TestBatchListBetweenNodesIsSigned(t *testing.T) {
	n1, _ := batchNodes(t)
	rec := n1.call(t, http.MethodPost, batchListPath, `{"what":"files","access":{"Admin":true}}`, keyAdmin)
	if rec.Code != http.StatusUnauthorized {
		t.Fatalf("an unsigned list: %d %s, want 401", rec.Code, rec.Body)
	}
}
