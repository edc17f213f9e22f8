package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"inferd/httpapi/admin"
	"inferd/scheduler"
	"inferd/store"
)

// operatorAdmin is the admin API with the operator's door of e's server,
// as the daemon serves it on its socket.
func operatorAdmin(e *testEnv) http.Handler {
	return admin.New(e.store, zerolog.Nop(), admin.WithCalls(e.h.(*Server).OperatorCalls()))
}

// operatorLines decodes the answer of an operator's call, line by line.
func operatorLines(t *testing.T, rec *httptest.ResponseRecorder) []operatorCallLine {
	t.Helper()
	if rec.Code != http.StatusOK || rec.Header().Get("Content-Type") != "application/x-ndjson" {
		t.Fatalf("status %d (%s), want 200 ndjson: %s", rec.Code, rec.Header().Get("Content-Type"), rec.Body)
	}
	var out []operatorCallLine
	for _, l := range strings.Split(strings.TrimSpace(rec.Body.String()), "\n") {
		var line operatorCallLine
		if err := json.Unmarshal([]byte(l), &line); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
		out = append(out, line)
	}
	return out
}

// inferd call runs any team's project by id, with no key, and answers its
// end; what it cannot run is answered in the admin API's JSON errors.
func TestOperatorCallRunsAnyTeamsProjectAndAnswersItsEnd(t *testing.T) {
	e := newEnv(t, Options{})
	e.sched.instant = true
	adm := operatorAdmin(e)
	lines := operatorLines(t, serve(adm, "POST", "/admin/projects/hidden/call", `{"n":1}`))
	if len(lines) != 1 || lines[0].CallID != "call_1" || lines[0].State != store.CallSucceeded ||
		len(lines[0].Outputs) != 1 || string(lines[0].Outputs[0]) != `{"ok":true}` {
		t.Errorf("answer %+v, want call_1 succeeded with its outputs", lines)
	}
	if string(e.sched.lastReq.Inputs) != `{"n":1}` {
		t.Errorf("started with inputs %s", e.sched.lastReq.Inputs)
	}
	serve(adm, "POST", "/admin/projects/echo/call", "")
	if string(e.sched.lastReq.Inputs) != `{}` {
		t.Errorf("no inputs started with %s, want {}", e.sched.lastReq.Inputs)
	}
	if msg := apiErrorReply(t, serve(adm, "POST", "/admin/projects/nope/call", `{}`), http.StatusNotFound, codeNotFound); msg != "project nope not found" {
		t.Errorf("unknown project: %q", msg)
	}
	apiErrorReply(t, serve(adm, "POST", "/admin/projects/echo/call", `{nope`), http.StatusBadRequest, codeBadRequest)
	e.sched.submitErr = fmt.Errorf("%w (1000 calls waiting)", scheduler.ErrQueueFull)
	if msg := apiErrorReply(t, serve(adm, "POST", "/admin/projects/echo/call", `{}`), http.StatusServiceUnavailable, codeUnavailable); !strings.Contains(msg, "queue full") {
		t.Errorf("a refused start: %q", msg)
	}
	if msg := apiErrorReply(t, serve(admin.New(e.store, zerolog.Nop()), "POST", "/admin/projects/echo/call", `{}`), http.StatusNotImplemented, codeInternal); !strings.Contains(msg, "running daemon") {
		t.Errorf("no daemon: %q", msg)
	}
}

// With stream=1 each line the model streams comes as it comes; a client
// that goes away cancels the call.
func TestOperatorCallStreamsLinesAndItsClientLeavingCancelsIt(t *testing.T) {
	streams := NewStreams()
	e := newEnv(t, Options{Streams: streams})
	srv := httptest.NewServer(operatorAdmin(e))
	t.Cleanup(srv.Close)
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	req, _ := http.NewRequestWithContext(ctx, "POST", srv.URL+"/admin/projects/echo/call?stream=1", strings.NewReader(`{}`))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	waitLookup(t, e.sched, "call_1")
	streams.CallRunning("call_1")
	streams.CallOutput("call_1", json.RawMessage(`{"token":"a"}`))
	line, err := bufio.NewReader(resp.Body).ReadString('\n')
	if err != nil || line != `{"output":{"token":"a"}}`+"\n" {
		t.Fatalf("first line %q, %v", line, err)
	}
	leave()
	eventuallyTrue(t, func() bool {
		c, _, _ := e.sched.Lookup("call_1")
		return c.State == store.CallFailed && c.Message == "error: cancelled by request"
	})
}

// In cluster mode the call runs on the node its project is placed on: the
// operator's door forwards it there, signed, under /cluster/v1/.
func TestOperatorCallOfAProjectPlacedOnAnotherNodeRunsThere(t *testing.T) {
	a, b := newTestNode(t, "a", Options{}), newTestNode(t, "b", Options{})
	b.env.sched.instant = true
	a.routeTo("echo", b.info)
	lines := operatorLines(t, serve(operatorAdmin(a.env), "POST", "/admin/projects/echo/call", `{"n":2}`))
	if len(lines) != 1 || lines[0].CallID != "call_1" || lines[0].State != store.CallSucceeded {
		t.Errorf("answer %+v, want b's call_1 succeeded", lines)
	}
	if a.calls() != 0 || b.calls() != 1 {
		t.Errorf("calls: a %d, b %d; want the call on b only", a.calls(), b.calls())
	}
	if seen := b.requests(); len(seen) != 1 || seen[0].path != "/cluster/v1/projects/echo/call" || seen[0].body != `{"n":2}` {
		t.Errorf("b received %+v, want the call under /cluster/v1/", seen)
	}
	// Unsigned, the route between nodes runs nothing.
	rec := b.post(t, "/cluster/v1/projects/echo/call", `{}`)
	if rec.Code != http.StatusUnauthorized || b.calls() != 1 {
		t.Errorf("unsigned: status %d, %d calls on b", rec.Code, b.calls())
	}
}
