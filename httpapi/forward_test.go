package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/cluster"
	"inferd/scheduler"
	"inferd/store"
)

var clusterSecret = []byte(strings.Repeat("k", cluster.MinSecretBytes))

// fakeRouter routes each project as set; an unset project has no node.
type fakeRouter struct {
	mu     sync.Mutex
	routes map[string]cluster.Route
	nodes  map[string]cluster.NodeInfo
}

// The real router is what the fake stands for.
var _ ClusterRouter = (*cluster.Router)(nil)

func (f *fakeRouter) Route(_ context.Context, project string, fitsHere func() bool) (cluster.Route, error) {
	f.mu.Lock()
	rt, ok := f.routes[project]
	f.mu.Unlock()
	switch {
	case ok:
		return rt, nil
	case fitsHere != nil && fitsHere():
		return cluster.Route{Local: true}, nil
	}
	return cluster.Route{}, fmt.Errorf("project %s: %w", project, cluster.ErrNoNode)
}

func (f *fakeRouter) Node(name string) (cluster.NodeInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.nodes[name]
	return n, ok
}

// seenRequest is a request as a test node's server received it.
type seenRequest struct {
	path   string
	header http.Header
	body   string
}

// testNode is one node of a test cluster: the API over real HTTP, its fake
// scheduler and store, and the requests it received.
type testNode struct {
	name    string
	env     *testEnv
	srv     *httptest.Server
	router  *fakeRouter
	routing *Routing
	info    cluster.NodeInfo

	mu       sync.Mutex
	seen     []seenRequest
	callNode map[string]string // call id: the node it is pending on
}

func newTestNode(t *testing.T, name string, opts Options) *testNode {
	t.Helper()
	signer, err := cluster.NewSigner(name, clusterSecret, nil)
	if err != nil {
		t.Fatal(err)
	}
	n := &testNode{name: name, router: &fakeRouter{routes: map[string]cluster.Route{}, nodes: map[string]cluster.NodeInfo{}},
		callNode: map[string]string{}}
	c := &Routing{Router: n.router, Signer: signer, CallNode: func(id string) (string, error) {
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.callNode[id], nil
	}}
	c.Handle(http.MethodGet, "ping/:what", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"from": ClusterPeer(r), "what": httprouter.ParamsFromContext(r.Context()).ByName("what")})
	}))
	// A catch-all, as the payload API mounts itself.
	c.Handle(http.MethodGet, "files/*rest", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"from": ClusterPeer(r), "path": r.URL.Path})
	}))
	opts.Routing, n.routing = c, c
	n.env = newEnv(t, opts)
	n.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		n.mu.Lock()
		n.seen = append(n.seen, seenRequest{r.URL.Path, r.Header.Clone(), string(body)})
		n.mu.Unlock()
		r.Body = io.NopCloser(bytes.NewReader(body))
		n.env.h.ServeHTTP(w, r)
	}))
	t.Cleanup(n.srv.Close)
	n.info = cluster.NodeInfo{Name: name, Advertise: n.srv.URL}
	return n
}

// routeTo makes n send the starts of project to nodes, in that order.
func (n *testNode) routeTo(project string, nodes ...cluster.NodeInfo) {
	n.router.mu.Lock()
	defer n.router.mu.Unlock()
	n.router.routes[project] = cluster.Route{Nodes: nodes}
	for _, o := range nodes {
		n.router.nodes[o.Name] = o
	}
}

func (n *testNode) requests() []seenRequest {
	n.mu.Lock()
	defer n.mu.Unlock()
	return append([]seenRequest(nil), n.seen...)
}

func (n *testNode) calls() int {
	n.env.sched.mu.Lock()
	defer n.env.sched.mu.Unlock()
	return len(n.env.sched.calls)
}

// post sends a request to n's server as a client would.
func (n *testNode) post(t *testing.T, path, body string, header ...string) *httptest.ResponseRecorder {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, n.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	return do(t, req)
}

// do sends req and returns the answer as a recorder, for the helpers that
// check answers.
func do(t *testing.T, req *http.Request) *httptest.ResponseRecorder {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	rec := httptest.NewRecorder()
	for k, v := range resp.Header {
		rec.Header()[k] = v
	}
	rec.WriteHeader(resp.StatusCode)
	_, _ = io.Copy(rec, resp.Body)
	return rec
}

// deadNode is a node whose address refuses connections.
func deadNode(t *testing.T, name string) cluster.NodeInfo {
	srv := httptest.NewServer(http.NotFoundHandler())
	srv.Close()
	return cluster.NodeInfo{Name: name, Advertise: srv.URL}
}

const startEcho = `{"apiKey":"` + keyAcme + `","modelKey":"mk-echo","modelInputs":{"prompt":"hi"}}`

func TestStartOfAProjectPlacedOnAnotherNodeRunsThere(t *testing.T) {
	a, b := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{})
	b.env.sched.instant = true
	a.routeTo("echo", b.info)

	m := inferenceReply(t, a.post(t, "/start/v4/", startEcho))
	if m["message"] != "success" || m["callID"] != "call_1" {
		t.Errorf("answer %v, want b's call_1 with success", m)
	}
	if a.calls() != 0 || b.calls() != 1 {
		t.Errorf("calls: a %d, b %d; want the call on b only", a.calls(), b.calls())
	}
	seen := b.requests()
	if len(seen) != 1 {
		t.Fatalf("b received %d requests, want 1", len(seen))
	}
	if seen[0].body != startEcho || seen[0].path != "/start/v4/" {
		t.Errorf("b received %s %s, want the client's own body on its path", seen[0].path, seen[0].body)
	}
	if got := seen[0].header.Get(cluster.ForwardedHeader); got != "a" {
		t.Errorf("%s = %q, want a", cluster.ForwardedHeader, got)
	}
	if !strings.HasPrefix(seen[0].header.Get(cluster.AuthHeader), "a ") {
		t.Errorf("forward not signed by a: %q", seen[0].header.Get(cluster.AuthHeader))
	}
	if b.env.sched.lastReq.Wait == 0 || string(b.env.sched.lastReq.Inputs) != `{"prompt":"hi"}` {
		t.Errorf("b's start = %+v, want the client's inputs and a wait", b.env.sched.lastReq)
	}
}

func TestForwardedStartKeepsTheClientsKey(t *testing.T) {
	a, b := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{})
	b.env.sched.instant = true
	a.routeTo("echo", b.info)
	// A key that only a knows: b, which runs the call, checks the client's
	// key itself, so it refuses a key it does not know.
	a.env.store.addKey(t, "ik_00000000aa_only", "acme", store.ScopeTeam, false)
	m := inferenceReply(t, a.post(t, "/start/v4", `{"apiKey":"ik_00000000aa_only","modelKey":"mk-echo","modelInputs":{}}`))
	if m["message"] != "error: invalid apiKey" || b.calls() != 0 {
		t.Errorf("answer %v with %d calls on b; want b's refusal of the key", m, b.calls())
	}
}

// A start forwarded to the node that runs it spends the client's key's
// rate once, on the node the client reached: with a burst of one on each
// node, a start through a forwarded to b leaves b's token for a start the
// client sends to b itself.
func TestForwardedStartSpendsTheKeysRateOnce(t *testing.T) {
	limits := Options{Limits: Limits{RequestsPerSecond: 0.001, Burst: 1}}
	a, b := newTestNode(t, "a", limits), newTestNode(t, "b", limits)
	b.env.sched.instant = true
	a.routeTo("echo", b.info)
	b.router.routes["echo"] = cluster.Route{Local: true} // placed on b
	if m := inferenceReply(t, a.post(t, "/start/v4", startEcho)); m["message"] != "success" {
		t.Fatalf("a start through a: %v", m)
	}
	if m := inferenceReply(t, b.post(t, "/start/v4", startEcho)); m["message"] != "success" {
		t.Errorf("a start sent to b after one forwarded there: %v; want b's token unspent by the forward", m)
	}
	if m := inferenceReply(t, a.post(t, "/start/v4", startEcho)); !strings.Contains(m["message"].(string), "rate limit") {
		t.Errorf("a second start through a: %v; want a's rate limit", m)
	}
}

func TestForwardedStartIsNotForwardedAgain(t *testing.T) {
	a, b, c := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{}), newTestNode(t, "c", Options{})
	b.env.sched.instant = true
	a.routeTo("echo", b.info)
	b.routeTo("echo", c.info) // the placement moved on meanwhile

	m := inferenceReply(t, a.post(t, "/start/v4", startEcho))
	if m["message"] != "success" {
		t.Errorf("answer %v, want success", m)
	}
	if b.calls() != 1 || len(c.requests()) != 0 {
		t.Errorf("b ran %d calls, c received %d requests; want b to run it", b.calls(), len(c.requests()))
	}
}

func TestStartMarkedForwardedWithoutAValidSignatureIsRefused(t *testing.T) {
	b, c := newTestNode(t, "b", Options{}), newTestNode(t, "c", Options{})
	b.routeTo("echo", c.info)
	other, _ := cluster.NewSigner("a", []byte(strings.Repeat("x", cluster.MinSecretBytes)), nil)
	for _, tc := range []struct {
		name string
		sign func(*http.Request)
	}{
		{"unsigned", func(*http.Request) {}},
		{"another cluster's secret", other.Sign},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, _ := http.NewRequest(http.MethodPost, b.srv.URL+"/start/v4", strings.NewReader(startEcho))
			req.Header.Set(cluster.ForwardedHeader, "a")
			tc.sign(req)
			m := inferenceReply(t, do(t, req))
			if !strings.Contains(m["message"].(string), "not signed by a node of this cluster") {
				t.Errorf("message %q, want the refusal", m["message"])
			}
			if b.calls() != 0 || len(c.requests()) != 0 {
				t.Errorf("b ran %d calls, c received %d requests; want neither", b.calls(), len(c.requests()))
			}
		})
	}
}

func TestForwardGoesToTheNextNodeWhenOneCannotBeReached(t *testing.T) {
	a, b := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{})
	b.env.sched.instant = true
	a.routeTo("echo", deadNode(t, "gone"), b.info)
	m := inferenceReply(t, a.post(t, "/start/v4", startEcho))
	if m["message"] != "success" || b.calls() != 1 {
		t.Errorf("answer %v, b ran %d calls; want b's success", m, b.calls())
	}
}

func TestStartAnswersClusterUnavailableWhenNoNodeTakesIt(t *testing.T) {
	a := newTestNode(t, "a", Options{})
	a.routeTo("zeta", deadNode(t, "gone"), deadNode(t, "lost"))
	for _, tc := range []struct{ name, body string }{
		{"every placed node unreachable", `{"apiKey":"` + keyAcme + `","modelKey":"mk-zeta","modelInputs":{}}`},
		{"no placement", startEcho}, // the fake router has no route for echo
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := a.post(t, "/start/v4", tc.body)
			if rec.Code != http.StatusServiceUnavailable {
				t.Fatalf("HTTP %d, want 503: %s", rec.Code, rec.Body)
			}
			rec.Code = http.StatusOK // the body is the inference answer's
			if m := inferenceReply(t, rec); m["message"] != "error: cluster unavailable; retry" {
				t.Errorf("message %q", m["message"])
			}
			if a.calls() != 0 {
				t.Errorf("a ran %d calls, want none", a.calls())
			}
		})
	}
}

func TestRunOfAProjectPlacedOnAnotherNodeRunsThere(t *testing.T) {
	a, b := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{})
	b.env.sched.instant = true
	a.routeTo("echo", b.info)
	rec := a.post(t, "/run/echo/generate", `{"prompt":"hi"}`, "X-Banana-API-Key", keyAcme, bananaRequestIDHeader, "req-1")
	if rec.Code != http.StatusOK || strings.TrimSpace(rec.Body.String()) != `{"ok":true}` {
		t.Fatalf("HTTP %d %s, want b's model answer", rec.Code, rec.Body)
	}
	if rec.Header().Get(callIDHeader) != "call_1" || a.calls() != 0 || b.calls() != 1 {
		t.Errorf("call id %q, calls a %d b %d; want b's call_1", rec.Header().Get(callIDHeader), a.calls(), b.calls())
	}
	if got := b.env.sched.lastReq; got.Route != "/generate" || got.IdempotencyKey != "req-1" {
		t.Errorf("b's start = route %q, key %q; want the client's", got.Route, got.IdempotencyKey)
	}

	a.routeTo("echo", deadNode(t, "gone"))
	rec = a.post(t, "/run/echo/", `{}`, "X-Banana-API-Key", keyAcme)
	if msg := apiErrorReply(t, rec, http.StatusServiceUnavailable, codeUnavailable); msg != "cluster unavailable; retry" {
		t.Errorf("message %q", msg)
	}
}

func TestCancelOfACallOnAnotherNodeIsForwardedThere(t *testing.T) {
	a, b := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{})
	call := store.Call{ID: "call_b1", ProjectID: "echo", TeamID: "acme", State: store.CallRunning, Created: time.Now()}
	a.env.sched.add(call) // a reads the record from the store
	b.env.sched.add(call) // b runs it
	a.mu.Lock()
	a.callNode[call.ID] = "b"
	a.mu.Unlock()
	a.router.nodes["b"] = b.info

	m := inferenceReply(t, a.post(t, "/cancel/v4", `{"apiKey":"`+keyAcme+`","callID":"call_b1"}`))
	if m["message"] != "cancelled" {
		t.Fatalf("answer %v, want cancelled", m)
	}
	if got, _, _ := b.env.sched.Lookup(call.ID); got.Message != "error: cancelled by request" {
		t.Errorf("b's call: %q, want cancelled", got.Message)
	}
	if got, _, _ := a.env.sched.Lookup(call.ID); got.State != store.CallRunning {
		t.Errorf("a cancelled it itself: %+v", got)
	}

	// A call on a node that is not live: no node can cancel it now.
	a.env.sched.add(store.Call{ID: "call_c1", ProjectID: "echo", TeamID: "acme", State: store.CallQueued, Created: time.Now()})
	a.mu.Lock()
	a.callNode["call_c1"] = "c"
	a.mu.Unlock()
	rec := a.post(t, "/cancel/v4", `{"apiKey":"`+keyAcme+`","callID":"call_c1"}`)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "cluster unavailable; retry") {
		t.Errorf("HTTP %d %s, want 503 cluster unavailable", rec.Code, rec.Body)
	}
}

func TestClusterAPIAnswersOnlyNodesOfTheCluster(t *testing.T) {
	b := newTestNode(t, "b", Options{})
	a, _ := cluster.NewSigner("a", clusterSecret, nil)
	other, _ := cluster.NewSigner("a", []byte(strings.Repeat("x", cluster.MinSecretBytes)), nil)
	get := func(path string, sign func(*http.Request)) *httptest.ResponseRecorder {
		req, _ := http.NewRequest(http.MethodGet, b.srv.URL+path, nil)
		sign(req)
		return do(t, req)
	}
	for _, tc := range []struct {
		name string
		path string
		sign func(*http.Request)
	}{
		{"unsigned", "/cluster/v1/ping/x", func(*http.Request) {}},
		{"another cluster's secret", "/cluster/v1/ping/x", other.Sign},
		{"unsigned, no such route", "/cluster/v1/nothing", func(*http.Request) {}},
		{"signed for another path", "/cluster/v1/ping/x", func(r *http.Request) {
			moved := r.Clone(context.Background())
			moved.URL.Path = "/cluster/v1/ping/y"
			a.Sign(moved)
			r.Header.Set(cluster.AuthHeader, moved.Header.Get(cluster.AuthHeader))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			apiErrorReply(t, get(tc.path, tc.sign), http.StatusUnauthorized, codeUnauthorized)
		})
	}
	rec := get("/cluster/v1/ping/x", a.Sign)
	if got := decode[map[string]string](t, rec); rec.Code != http.StatusOK || got["from"] != "a" || got["what"] != "x" {
		t.Errorf("signed: HTTP %d %v, want the handler's answer naming a", rec.Code, got)
	}
	rec = get("/cluster/v1/files/call_1/inputs", a.Sign)
	if got := decode[map[string]string](t, rec); rec.Code != http.StatusOK || got["path"] != "/cluster/v1/files/call_1/inputs" {
		t.Errorf("signed, under a catch-all: HTTP %d %v, want the handler's answer with the whole path", rec.Code, got)
	}
	apiErrorReply(t, get("/cluster/v1/nothing", a.Sign), http.StatusNotFound, codeNotFound)
}

func TestSingleBoxHasNoClusterAPIAndForwardsNothing(t *testing.T) {
	env := newEnv(t, Options{})
	env.sched.instant = true
	apiErrorReply(t, serve(env.h, http.MethodGet, "/cluster/v1/ping/x", ""), http.StatusNotFound, codeNotFound)
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4", startEcho, cluster.ForwardedHeader, "a"))
	if m["message"] != "success" {
		t.Errorf("answer %v, want the call run here", m)
	}
}

func TestAdminCancelOfACallOnAnotherNodeIsMadeThere(t *testing.T) {
	a, b := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{})
	b.env.sched.add(store.Call{ID: "call_run", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
	b.env.sched.add(store.Call{ID: "call_done", ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded})
	a.router.nodes["b"] = b.info
	a.mu.Lock()
	for _, id := range []string{"call_run", "call_done", "call_gone"} {
		a.callNode[id] = "b"
	}
	a.callNode["call_lost"] = "c"
	a.mu.Unlock()
	var localCalls []string
	cancel := a.env.sched.Cancel
	c := a.routing.Canceller(func(id string) (store.Call, error) {
		localCalls = append(localCalls, id)
		return cancel(id)
	})

	got, err := c("call_run")
	if err != nil || got.State != store.CallFailed || got.Message != "error: cancelled by request" {
		t.Errorf("cancel of b's running call = %+v, %v; want it cancelled", got, err)
	}
	if _, err := c("call_done"); !errors.Is(err, scheduler.ErrFinished) || !strings.Contains(err.Error(), "(succeeded)") {
		t.Errorf("cancel of b's finished call: %v, want ErrFinished (succeeded)", err)
	}
	if _, err := c("call_gone"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("cancel of a call b does not know: %v, want ErrNotFound", err)
	}
	if _, err := c("call_lost"); !errors.Is(err, errClusterUnavailable) {
		t.Errorf("cancel of a call on a node that is not live: %v, want cluster unavailable", err)
	}
	a.env.sched.add(store.Call{ID: "call_here", ProjectID: "echo", TeamID: "acme", State: store.CallQueued})
	if got, err := c("call_here"); err != nil || got.State != store.CallFailed || len(localCalls) != 1 {
		t.Errorf("cancel of a's own call = %+v, %v (local cancels %v); want it cancelled here", got, err, localCalls)
	}
}

func TestForwardToANodeThatNeverAnswersEndsUnavailableWithoutTryingAnother(t *testing.T) {
	a, c := newTestNode(t, "a", Options{StartWait: time.Millisecond}), newTestNode(t, "c", Options{})
	a.routing.grace = 50 * time.Millisecond
	got := make(chan struct{}, 1)
	release := make(chan struct{})
	silent := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- struct{}{}
		select { // cut off after it took the request
		case <-r.Context().Done():
		case <-release:
		}
	}))
	t.Cleanup(func() { close(release); silent.Close() })
	a.routeTo("echo", cluster.NodeInfo{Name: "b", Advertise: silent.URL}, c.info)

	rec := a.post(t, "/start/v4", startEcho)
	if rec.Code != http.StatusServiceUnavailable || !strings.Contains(rec.Body.String(), "error: cluster unavailable; retry") {
		t.Errorf("HTTP %d %s, want 503 cluster unavailable", rec.Code, rec.Body)
	}
	if len(got) != 1 || len(c.requests()) != 0 {
		t.Errorf("b took %d requests, c %d; want b's one only (it may have made the call)", len(got), len(c.requests()))
	}
}

func TestStartOfAProjectWithNoPlacementRunsHereWhenThisNodeFitsIt(t *testing.T) {
	a := newTestNode(t, "a", Options{})
	a.env.sched.instant = true
	var mu sync.Mutex // Fits runs in the server's goroutine
	var asked []string
	a.routing.Fits = func(p store.Project) bool {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, p.ID)
		return p.ID == "echo"
	}
	if m := inferenceReply(t, a.post(t, "/start/v4", startEcho)); m["message"] != "success" || a.calls() != 1 {
		t.Errorf("answer %v, %d calls here; want echo run here", m, a.calls())
	}
	rec := a.post(t, "/start/v4", `{"apiKey":"`+keyAcme+`","modelKey":"mk-zeta","modelInputs":{}}`)
	if rec.Code != http.StatusServiceUnavailable || a.calls() != 1 {
		t.Errorf("zeta: HTTP %d with %d calls here; want 503 and nothing run", rec.Code, a.calls())
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(asked, ",") != "echo,zeta" {
		t.Errorf("Fits asked for %v, want each start's project", asked)
	}
}

// TestForwardedBodiesAreNotHeldToTheForwardingNodesAddress: a node forwards
// many clients' starts from its one address, each already within the
// budgets of the node it came through; the node that runs them counts them
// in its total only, while a client at that address is held to its share.
func TestForwardedBodiesAreNotHeldToTheForwardingNodesAddress(t *testing.T) {
	a, b := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{Limits: Limits{BodyBytesPerSource: 2048}})
	b.env.sched.instant = true
	a.routeTo("echo", b.info)
	start := `{"apiKey":"` + keyAcme + `","modelKey":"mk-echo","modelInputs":{"pad":"` + strings.Repeat("x", 4096) + `"}}`
	if m := inferenceReply(t, a.post(t, "/start/v4", start)); m["message"] != "success" {
		t.Errorf("a start forwarded by a: %v", m["message"])
	}
	if m := inferenceReply(t, b.post(t, "/start/v4", start)); !strings.HasSuffix(m["message"].(string), "(limits.bodyBytesPerSource); retry later") {
		t.Errorf("the same start from a client at that address: %v", m["message"])
	}
}
