package cluster

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/store/etcd"
)

// members is a fake membership: the live nodes by name.
type members struct {
	mu    sync.Mutex
	nodes map[string]NodeInfo
}

func (m *members) Nodes() []NodeInfo {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []NodeInfo
	for _, n := range m.nodes {
		out = append(out, n)
	}
	slices.SortFunc(out, func(a, b NodeInfo) int { return strings.Compare(a.Name, b.Name) })
	return out
}

func (m *members) NodeInfo(name string) (NodeInfo, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.nodes[name]
	return n, ok
}

func (m *members) drop(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.nodes, name)
}

var testSecret = []byte(strings.Repeat("s", MinSecretBytes))

// payloadNode is one node's payload store behind its own HTTP server.
type payloadNode struct {
	name string
	dir  string
	p    *PayloadStore
	srv  *httptest.Server
}

// payloadCluster starts one payload store per name, each serving its API
// on a loopback server and listed as live in the membership they share.
func payloadCluster(t *testing.T, names ...string) (*members, map[string]*payloadNode) {
	t.Helper()
	m := &members{nodes: map[string]NodeInfo{}}
	nodes := map[string]*payloadNode{}
	for _, name := range names {
		signer, err := NewSigner(name, testSecret, nil)
		if err != nil {
			t.Fatal(err)
		}
		dir := filepath.Join(t.TempDir(), "payloads")
		p, err := OpenPayloads(PayloadOptions{Dir: dir, Signer: signer, Peers: m, MaxBytes: 1 << 20})
		if err != nil {
			t.Fatal(err)
		}
		mux := http.NewServeMux()
		mux.Handle(PayloadsPath, p)
		srv := httptest.NewServer(mux)
		t.Cleanup(srv.Close)
		m.nodes[name] = NodeInfo{Name: name, Advertise: srv.URL}
		nodes[name] = &payloadNode{name: name, dir: dir, p: p, srv: srv}
	}
	return m, nodes
}

func (n *payloadNode) holds(id, kind string) ([]byte, bool) {
	b, err := os.ReadFile(filepath.Join(n.dir, id+"."+kind))
	return b, err == nil
}

// Put keeps the payload here and one copy on the other node, both on disk;
// a third node that holds neither fetches it; a node alone keeps it alone.
func TestPayloadIsCopiedToAnotherNodeAndFetchedFromIt(t *testing.T) {
	_, nodes := payloadCluster(t, "a", "b", "c")
	a, c := nodes["a"], nodes["c"]
	in := bytes.Repeat([]byte("x"), 200<<10)
	held, err := a.p.Put(context.Background(), "call_1", etcd.KindInputs, in)
	if err != nil {
		t.Fatal(err)
	}
	if len(held) != 2 || held[0] != "a" || held[1] == "a" {
		t.Fatalf("Put held on %v, want a and one other node", held)
	}
	for _, name := range held {
		if b, ok := nodes[name].holds("call_1", etcd.KindInputs); !ok || !bytes.Equal(b, in) {
			t.Errorf("node %s holds %d bytes, %v; want the payload", name, len(b), ok)
		}
	}
	ref := etcd.RefOf(in)
	ref.Nodes = held
	reader := c
	if held[1] == "c" {
		reader = nodes["b"] // the node without a copy reads over the network
	}
	if got, err := reader.p.Get(context.Background(), "call_1", etcd.KindInputs, ref); err != nil || !bytes.Equal(got, in) {
		t.Errorf("Get on node %s = %d bytes, %v; want the payload", reader.name, len(got), err)
	}

	_, alone := payloadCluster(t, "solo")
	if held, err := alone["solo"].p.Put(context.Background(), "call_2", etcd.KindOutputs, in); err != nil || !slices.Equal(held, []string{"solo"}) {
		t.Errorf("Put on a lone node = %v, %v; want [solo]", held, err)
	}
}

// With the first holder gone (dead, or its copy lost), the payload comes
// from the second; with every holder gone the error names each.
func TestPayloadIsFetchedFromTheSecondHolderWhenTheFirstIsGone(t *testing.T) {
	m, nodes := payloadCluster(t, "a", "b", "c")
	out := bytes.Repeat([]byte("y"), 100<<10)
	ref := etcd.RefOf(out)
	ref.Nodes = []string{"a", "b"}
	for _, name := range ref.Nodes {
		if err := nodes[name].p.write("call_1", etcd.KindOutputs, bytes.NewReader(out), ref.SHA256); err != nil {
			t.Fatal(err)
		}
	}
	nodes["a"].srv.Close() // a died; the membership has not noticed yet
	got, err := nodes["c"].p.Get(context.Background(), "call_1", etcd.KindOutputs, ref)
	if err != nil || !bytes.Equal(got, out) {
		t.Fatalf("Get with a down = %d bytes, %v; want the payload from b", len(got), err)
	}
	m.drop("a")
	if got, err := nodes["c"].p.Get(context.Background(), "call_1", etcd.KindOutputs, ref); err != nil || !bytes.Equal(got, out) {
		t.Fatalf("Get with a gone = %d bytes, %v; want the payload from b", len(got), err)
	}
	nodes["b"].srv.Close()
	_, err = nodes["c"].p.Get(context.Background(), "call_1", etcd.KindOutputs, ref)
	if err == nil || !strings.Contains(err.Error(), "a: not a live node") || !strings.Contains(err.Error(), "b: ") {
		t.Errorf("Get with both gone = %v; want an error naming a and b", err)
	}
}

// A copy whose bytes are not those the ref names is refused, and the next
// holder's used; a PUT whose body is not the digest it was sent with is
// refused, and nothing is kept.
func TestPayloadWithAnotherSHA256IsRefused(t *testing.T) {
	_, nodes := payloadCluster(t, "a", "b", "c")
	want := bytes.Repeat([]byte("z"), 70<<10)
	ref := etcd.RefOf(want)
	ref.Nodes = []string{"a", "b"}
	bad := bytes.Repeat([]byte("Z"), len(want))
	badSum := sha256.Sum256(bad)
	if err := nodes["a"].p.write("call_1", etcd.KindInputs, bytes.NewReader(bad), hex.EncodeToString(badSum[:])); err != nil {
		t.Fatal(err)
	}
	if err := nodes["b"].p.write("call_1", etcd.KindInputs, bytes.NewReader(want), ref.SHA256); err != nil {
		t.Fatal(err)
	}
	if got, err := nodes["c"].p.Get(context.Background(), "call_1", etcd.KindInputs, ref); err != nil || !bytes.Equal(got, want) {
		t.Errorf("Get = %d bytes, %v; want b's good copy", len(got), err)
	}
	ref.Nodes = []string{"a"}
	if _, err := nodes["c"].p.Get(context.Background(), "call_1", etcd.KindInputs, ref); err == nil || !strings.Contains(err.Error(), "sha256") {
		t.Errorf("Get of a's damaged copy only = %v; want a sha256 refusal", err)
	}

	req := signedRequest(t, "c", http.MethodPut, nodes["b"].srv.URL+PayloadsPath+"call_2/inputs", bytes.NewReader(bad))
	req.Header.Set(SHA256Header, ref.SHA256)
	if code := do(t, req); code != http.StatusBadRequest {
		t.Errorf("PUT with another body's digest: %d, want 400", code)
	}
	if _, ok := nodes["b"].holds("call_2", etcd.KindInputs); ok {
		t.Error("the refused PUT was kept")
	}
}

// Only signed requests reach the payloads: none, a wrong secret's or a
// replayed one for another path get 401.
func TestUnsignedPayloadRequestsAreRefused(t *testing.T) {
	_, nodes := payloadCluster(t, "a")
	a := nodes["a"]
	if err := a.p.write("call_1", etcd.KindInputs, strings.NewReader("secret inputs"), etcd.RefOf([]byte("secret inputs")).SHA256); err != nil {
		t.Fatal(err)
	}
	url := a.srv.URL + PayloadsPath + "call_1/inputs"
	stranger, _ := NewSigner("b", []byte(strings.Repeat("x", MinSecretBytes)), nil)
	for _, tc := range []struct {
		name string
		req  func() *http.Request
	}{
		{"unsigned GET", func() *http.Request { r, _ := http.NewRequest(http.MethodGet, url, nil); return r }},
		{"unsigned PUT", func() *http.Request {
			r, _ := http.NewRequest(http.MethodPut, url, strings.NewReader("evil"))
			r.Header.Set(SHA256Header, etcd.RefOf([]byte("evil")).SHA256)
			return r
		}},
		{"unsigned DELETE", func() *http.Request {
			r, _ := http.NewRequest(http.MethodDelete, a.srv.URL+PayloadsPath+"call_1", nil)
			return r
		}},
		{"another cluster's secret", func() *http.Request {
			r, _ := http.NewRequest(http.MethodGet, url, nil)
			stranger.Sign(r)
			return r
		}},
		{"signature of another path", func() *http.Request {
			r := signedRequest(t, "b", http.MethodGet, a.srv.URL+PayloadsPath+"call_2/inputs", nil)
			r2, _ := http.NewRequest(http.MethodGet, url, nil)
			r2.Header = r.Header
			return r2
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if code := do(t, tc.req()); code != http.StatusUnauthorized {
				t.Errorf("status %d, want 401", code)
			}
		})
	}
	if b, ok := a.holds("call_1", etcd.KindInputs); !ok || string(b) != "secret inputs" {
		t.Errorf("after the refused requests the payload is %q, %v; want it unchanged", b, ok)
	}
}

// Ids and kinds that could name a file outside the payloads directory, or
// anything but a payload, are refused before they touch the disk; so are
// bodies over the size cap and copies that would fill the disk.
func TestHostilePayloadRequestsAreRefused(t *testing.T) {
	_, nodes := payloadCluster(t, "a")
	a := nodes["a"]
	body := []byte("payload")
	sum := etcd.RefOf(body).SHA256
	for _, tc := range []struct {
		name, method, path string
		body               []byte
		want               int
	}{
		{"dot-dot id", http.MethodPut, PayloadsPath + "..%2F..%2Fevil/inputs", body, http.StatusBadRequest},
		{"slash in id", http.MethodPut, PayloadsPath + "a%2Fb/inputs", body, http.StatusBadRequest},
		{"dotted id", http.MethodGet, PayloadsPath + "call.x/inputs", nil, http.StatusBadRequest},
		{"unknown kind", http.MethodPut, PayloadsPath + "call_1/passwd", body, http.StatusBadRequest},
		{"extra segment", http.MethodPut, PayloadsPath + "call_1/inputs/x", body, http.StatusBadRequest},
		{"DELETE with a kind", http.MethodDelete, PayloadsPath + "call_1/inputs", nil, http.StatusBadRequest},
		{"over the size cap", http.MethodPut, PayloadsPath + "call_1/inputs", make([]byte, 1<<20+1), http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := signedRequest(t, "b", tc.method, a.srv.URL+tc.path, bytes.NewReader(tc.body))
			r.Header.Set(SHA256Header, sum)
			if code := do(t, r); code != tc.want {
				t.Errorf("status %d, want %d", code, tc.want)
			}
		})
	}
	// A path a router would clean first, straight to the handler.
	r := httptest.NewRequest(http.MethodPut, PayloadsPath+"../inputs", bytes.NewReader(body))
	r.Header.Set(SHA256Header, sum)
	s, _ := NewSigner("b", testSecret, nil)
	s.Sign(r)
	rec := httptest.NewRecorder()
	a.p.ServeHTTP(rec, r)
	if rec.Code != http.StatusBadRequest {
		t.Errorf("PUT %s: status %d, want 400", r.URL.Path, rec.Code)
	}

	a.p.free = func(string) (int64, error) { return DefaultMinFreeBytes + 3, nil }
	r = signedRequest(t, "b", http.MethodPut, a.srv.URL+PayloadsPath+"call_1/inputs", bytes.NewReader(body))
	r.Header.Set(SHA256Header, sum)
	if code := do(t, r); code != http.StatusInsufficientStorage {
		t.Errorf("PUT leaving under the free-space floor: %d, want 507", code)
	}
	entries, err := os.ReadDir(filepath.Dir(a.dir))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "payloads" {
		t.Errorf("beside the payloads directory: %v; want nothing written there", entries)
	}
	if left, _ := os.ReadDir(a.dir); len(left) != 0 {
		t.Errorf("payloads directory holds %d files after refusals, want none", len(left))
	}
}

// A node's Put fails when other nodes are live but none takes the copy: a
// payload on one node only is not durable in a cluster.
func TestPutFailsWhenNoOtherNodeTakesTheCopy(t *testing.T) {
	_, nodes := payloadCluster(t, "a", "b")
	nodes["b"].p.free = func(string) (int64, error) { return 0, nil } // b's disk is full
	_, err := nodes["a"].p.Put(context.Background(), "call_1", etcd.KindOutputs, []byte(`"big"`))
	if err == nil || !strings.Contains(err.Error(), "b: answered 507") {
		t.Errorf("Put = %v, want b's refusal", err)
	}
}

// Delete removes the call's files here and on the other holder.
func TestDeleteRemovesEveryCopy(t *testing.T) {
	_, nodes := payloadCluster(t, "a", "b")
	ctx := context.Background()
	for _, kind := range []string{etcd.KindInputs, etcd.KindOutputs} {
		if held, err := nodes["a"].p.Put(ctx, "call_1", kind, []byte(`"payload"`)); err != nil || len(held) != 2 {
			t.Fatalf("Put %s = %v, %v", kind, held, err)
		}
	}
	if _, err := nodes["a"].p.Put(ctx, "call_2", etcd.KindInputs, []byte(`"kept"`)); err != nil {
		t.Fatal(err)
	}
	nodes["b"].p.Delete("call_1", []string{"a", "b"})
	for _, n := range nodes {
		for _, kind := range []string{etcd.KindInputs, etcd.KindOutputs} {
			if _, ok := n.holds("call_1", kind); ok {
				t.Errorf("node %s still holds call_1's %s", n.name, kind)
			}
		}
		if _, ok := n.holds("call_2", etcd.KindInputs); !ok {
			t.Errorf("node %s lost call_2's inputs, which were not deleted", n.name)
		}
	}
}

func signedRequest(t *testing.T, from, method, url string, body *bytes.Reader) *http.Request {
	t.Helper()
	var r *http.Request
	var err error
	if body == nil {
		r, err = http.NewRequest(method, url, nil)
	} else {
		r, err = http.NewRequest(method, url, body)
	}
	if err != nil {
		t.Fatal(err)
	}
	s, _ := NewSigner(from, testSecret, nil)
	s.Sign(r)
	return r
}

func do(t *testing.T, r *http.Request) int {
	t.Helper()
	resp, err := http.DefaultClient.Do(r)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// Before the membership is given, nothing is held: whether another node is
// live is not known, so no copy could be promised.
func TestPutBeforeMembershipFails(t *testing.T) {
	signer, _ := NewSigner("a", testSecret, nil)
	p, err := OpenPayloads(PayloadOptions{Dir: t.TempDir(), Signer: signer})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.Put(context.Background(), "call_1", etcd.KindInputs, []byte(`"x"`)); !errors.Is(err, errNoPeers) {
		t.Errorf("Put before SetPeers = %v, want errNoPeers", err)
	}
	p.SetPeers(&members{nodes: map[string]NodeInfo{"a": {Name: "a"}}})
	if held, err := p.Put(context.Background(), "call_1", etcd.KindInputs, []byte(`"x"`)); err != nil || !slices.Equal(held, []string{"a"}) {
		t.Errorf("Put after SetPeers = %v, %v; want [a]", held, err)
	}
}

// fakeRefs answers HeldPayload from a map of id/kind.
type fakeRefs map[string]etcd.PayloadRef

func (f fakeRefs) HeldPayload(id, kind string) (etcd.PayloadRef, bool, error) {
	ref, ok := f[id+"/"+kind]
	return ref, ok, nil
}

// A sweep removes the old files no reference names this node for (a call
// that expired while the node was away, a write that never committed), and
// keeps the named ones and any written since the cut-off.
func TestSweepRemovesPayloadFilesNoCallNames(t *testing.T) {
	_, nodes := payloadCluster(t, "a")
	a := nodes["a"]
	now := time.Now()
	old := now.Add(-2 * time.Hour)
	files := map[string]time.Time{
		"call_named.inputs":     old, // kept: etcd names a
		"call_elsewhere.inputs": old, // removed: etcd names other nodes only
		"call_gone.outputs":     old, // removed: no reference
		"call_new.outputs":      now, // kept: written after the cut-off
	}
	for name, mtime := range files {
		path := filepath.Join(a.dir, name)
		if err := os.WriteFile(path, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mtime, mtime); err != nil {
			t.Fatal(err)
		}
	}
	refs := fakeRefs{
		"call_named/inputs":     {Nodes: []string{"b", "a"}},
		"call_elsewhere/inputs": {Nodes: []string{"b", "c"}},
	}
	n, err := a.p.Sweep(refs, now.Add(-time.Hour))
	if err != nil || n != 2 {
		t.Errorf("Sweep = %d, %v; want 2 removed", n, err)
	}
	for name, want := range map[string]bool{"call_named.inputs": true, "call_elsewhere.inputs": false, "call_gone.outputs": false, "call_new.outputs": true} {
		if _, err := os.Stat(filepath.Join(a.dir, name)); (err == nil) != want {
			t.Errorf("%s present %v after the sweep, want %v", name, err == nil, want)
		}
	}
}
