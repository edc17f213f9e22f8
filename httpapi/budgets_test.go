package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"inferd/httpapi/metrics"
	"inferd/store"
)

// refusedBy is the budget err names, or "".
func refusedBy(err error) string {
	var be *budgetError
	if !errors.As(err, &be) {
		return ""
	}
	return be.budget
}

func TestBodyBudgetCountsInAllAndPerSource(t *testing.T) {
	b := newBodyBudget(100, 60)
	a, a2, bb := b.account("a", true), b.account("a", true), b.account("b", true)
	if err := a.grow(50); err != nil {
		t.Fatal(err)
	}
	if got := refusedBy(a2.grow(20)); got != budgetBodyBytesPerSource {
		t.Errorf("source a past its 60: refused by %q", got)
	}
	if got := refusedBy(bb.check(51)); got != budgetBodyBytes {
		t.Errorf("b's 51 past the 100 in all: refused by %q", got)
	}
	if got := refusedBy(bb.grow(51)); got != budgetBodyBytes {
		t.Errorf("b's 51 taken past the 100 in all: refused by %q", got)
	}
	if err := bb.grow(50); err != nil {
		t.Errorf("b's 50 within both: %v", err)
	}
	a.close()
	if err := bb.grow(10); err != nil || b.inUse() != 60 {
		t.Errorf("after a let go: %v, %d in use", err, b.inUse())
	}
	bb.close()
	if b.inUse() != 0 || len(b.bySource) != 0 {
		t.Errorf("all given back: %d in use, %d sources kept", b.inUse(), len(b.bySource))
	}
}

// TestBodyBudgetMakesRoomForASourceWithinItsShare: with the total full, a
// source that would hold no more than its share (the total over the
// sources holding bytes, itself counted) gets its bytes by cutting the
// body of the largest holder above its share that best frees the room (its
// smallest that is large enough, the oldest of equals), and only as many as
// it needs; a source past its share is refused, and so is one when nobody
// is over theirs. What is cut is given back at once and interrupted, and
// its reader is refused.
func TestBodyBudgetMakesRoomForASourceWithinItsShare(t *testing.T) {
	b := newBodyBudget(120, 0)
	var interrupted []string
	hold := func(source, name string, n int64) *bodyAccount {
		t.Helper()
		acct := b.account(source, true)
		acct.cuttable(func() { interrupted = append(interrupted, name) })
		if err := acct.grow(n); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return acct
	}
	// Three sources fill it: x two bodies, y one, z one.
	x1, x2 := hold("x", "x1", 30), hold("x", "x2", 30)
	y1 := hold("y", "y1", 40)
	hold("z", "z1", 20)

	// w's share is 120/4 = 30: 40 is more than it.
	w := b.account("w", true)
	w.cuttable(func() {})
	if got := refusedBy(w.check(40)); got != budgetBodyBytes {
		t.Errorf("w asking past its share: refused by %q", got)
	}
	if got := refusedBy(w.grow(40)); got != budgetBodyBytes || len(interrupted) != 0 {
		t.Errorf("w asking past its share: refused by %q, cut %v", got, interrupted)
	}
	// 10 is within it: x (60, the largest over 30) loses its oldest of two
	// equal bodies, either of which frees the room.
	if err := w.check(10); err != nil {
		t.Errorf("w's check of 10: %v", err)
	}
	if err := w.grow(10); err != nil {
		t.Fatalf("w asking within its share: %v", err)
	}
	if len(interrupted) != 1 || interrupted[0] != "x1" || !x1.wasCut() || x2.wasCut() || y1.wasCut() {
		t.Errorf("cut %v; want x's oldest body only", interrupted)
	}
	if got := b.inUse(); got != 100 {
		t.Errorf("%d in use after the cut, want 100 (x1's 30 given back, w's 10 taken)", got)
	}
	if got := refusedBy(x1.grow(1)); got != budgetBodyBytes {
		t.Errorf("the cut body's next growth: refused by %q", got)
	}
	x1.close() // its reader ends: nothing more to give back
	if got := b.inUse(); got != 100 {
		t.Errorf("%d in use after the cut body closed, want 100", got)
	}
	if b.cuts.Load() != 1 {
		t.Errorf("cuts counted: %d", b.cuts.Load())
	}

	// The share is 120/4 = 30 and y, holding 40, is over it: a new
	// source v (share 120/5 = 24) taking 24 cuts y1.
	hold("v", "v1", 24)
	if !y1.wasCut() || len(interrupted) != 2 {
		t.Errorf("cut %v; want y's body next", interrupted)
	}
	// x 30, z 20, w 10, v 24: u takes the 36 free with no cut.
	u1 := hold("u", "u1", 36)
	if len(interrupted) != 2 {
		t.Errorf("cut %v for room there was", interrupted)
	}
	// Full, five sources (share 24): z's 4 more cut u's, the largest over.
	hold("z", "z2", 4)
	if !u1.wasCut() || x2.wasCut() || len(interrupted) != 3 {
		t.Errorf("cut %v; want u's body, the largest over the share", interrupted)
	}
	if got := b.inUse(); got != 88 {
		t.Errorf("%d in use, want 88", got)
	}
}

// TestBodyBudgetCutsTheBodyThatBestFreesTheRoom: an address over its
// share loses its smallest body that frees the room a small request needs,
// not a large upload that is almost in; a request no single body of it
// frees takes its largest first.
func TestBodyBudgetCutsTheBodyThatBestFreesTheRoom(t *testing.T) {
	b := newBodyBudget(100, 0)
	hold := func(source string, n int64) *bodyAccount {
		t.Helper()
		a := b.account(source, true)
		a.cuttable(func() {})
		if err := a.grow(n); err != nil {
			t.Fatal(err)
		}
		return a
	}
	big, mid, small := hold("x", 70), hold("x", 20), hold("x", 10)
	hold("y", 5)
	if big.wasCut() || mid.wasCut() || !small.wasCut() {
		t.Errorf("5 bytes cut big %v, mid %v, small %v; want the small one only", big.wasCut(), mid.wasCut(), small.wasCut())
	}
	// y holds 5, share 50: its next 40 need 35 more than the 5 free: no
	// one body but big frees them.
	hold("y", 40)
	if !big.wasCut() || mid.wasCut() {
		t.Errorf("40 bytes cut big %v, mid %v; want the big one", big.wasCut(), mid.wasCut())
	}
}

// TestBodyBudgetCutsOnlyBodiesThatCanBeInterrupted: an upload's account,
// which readBody does not read, is never cut; with nothing else over its
// share, a source within its share is refused.
func TestBodyBudgetCutsOnlyBodiesThatCanBeInterrupted(t *testing.T) {
	b := newBodyBudget(100, 0)
	upload := b.account("x", true)
	if err := upload.grow(100); err != nil {
		t.Fatal(err)
	}
	if got := refusedBy(b.account("y", true).grow(10)); got != budgetBodyBytes || upload.wasCut() {
		t.Errorf("y beside an upload that fills the budget: refused by %q, upload cut %v", got, upload.wasCut())
	}
}

func TestSourceOfGroupsAnIPv6ClientsSlash64(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{"10.0.0.1:5", "10.0.0.1:6"},
		{"[2001:db8::1]:5", "[2001:db8::ffff:2]:6"},
		{"[::ffff:10.0.0.1]:5", "10.0.0.1:7"},
	} {
		if sourceOf(tc.a) != sourceOf(tc.b) {
			t.Errorf("%s and %s are two sources: %s, %s", tc.a, tc.b, sourceOf(tc.a), sourceOf(tc.b))
		}
	}
	for _, tc := range []struct{ a, b string }{
		{"10.0.0.1:5", "10.0.0.2:5"},
		{"[2001:db8::1]:5", "[2001:db8:0:1::1]:5"},
	} {
		if sourceOf(tc.a) == sourceOf(tc.b) {
			t.Errorf("%s and %s are one source: %s", tc.a, tc.b, sourceOf(tc.a))
		}
	}
}

// startBody is a start of n bytes exactly (n > 200), its inputs padded.
func startBody(n int) string {
	head := `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "startOnly": true, "modelInputs": {"pad": "`
	tail := `"}}`
	return head + strings.Repeat("x", n-len(head)-len(tail)) + tail
}

// inferenceMessage decodes an inference answer's message.
func answerMessage(t *testing.T, body string) string {
	t.Helper()
	var a struct{ Message string }
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatalf("not an inference answer: %q", body)
	}
	return a.Message
}

// bigBody is the largest body in the tests of the body budget below, which
// allow two of them in all (limits.bodyBytes).
const bigBody = 1 << 20

// holdingPartOfABody serves such a budget, with a client at 192.0.2.1
// holding a start of bigBody bytes of which it sent 600 KiB, and returns the
// metrics, the server, the whole start and that client. Call it in a
// synctest bubble.
func holdingPartOfABody(t *testing.T) (*metrics.Metrics, *pipeServer, string, *pipeClient) {
	m := metrics.New(vm.NewSet())
	env := newEnv(t, Options{Metrics: m, MaxBodyBytes: bigBody, Limits: Limits{BodyBytes: 2 * bigBody}})
	ps := newPipeServer(t, env.h, 0)
	body := startBody(bigBody)
	holder := ps.dialFrom("192.0.2.1:1")
	holder.request("POST", "/start/v4", body[:600<<10], "Content-Length: "+strconv.Itoa(bigBody))
	synctest.Wait()
	return m, ps, body, holder
}

// TestBodyThatCannotFitIsRefusedBeforeItIsRead: while one client holds half
// a large body, a start whose announced length would pass limits.bodyBytes
// is refused at once (HTTP 200, "error:" naming the budget, Retry-After),
// before the server reads or sets aside a byte of it; the held bytes show in
// inferd_request_body_bytes and are given back once the body is in.
func TestBodyThatCannotFitIsRefusedBeforeItIsRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, ps, body, holder := holdingPartOfABody(t)
		// Its buffer went 64 KiB, 256 KiB, then the announced length.
		if got := metricValue(t, m, "inferd_request_body_bytes"); got != bigBody+1 {
			t.Fatalf("inferd_request_body_bytes = %v, want %d", got, bigBody+1)
		}

		// Its headers only: the answer comes before any of the body. From
		// the holder's own address: it would hold more than all of the
		// budget (from another, it would be within that address's share,
		// and cut the holder's body for room: the next test).
		other := ps.dialFrom("192.0.2.1:2")
		other.request("POST", "/start/v4", "", "Content-Length: "+strconv.Itoa(bigBody))
		resp, answer := other.response()
		if msg := answerMessage(t, answer); resp.StatusCode != 200 || resp.Header.Get("Retry-After") == "" ||
			msg != "error: server busy: request bodies being read hold the 2 MiB they may (limits.bodyBytes); retry later" {
			t.Errorf("a start past the budget: %d %q (Retry-After %q)", resp.StatusCode, msg, resp.Header.Get("Retry-After"))
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.bodyBytes"}`); n != 1 {
			t.Errorf("refusals counted: %v", n)
		}
		if got := metricValue(t, m, "inferd_request_body_bytes"); got != bigBody+1 {
			t.Errorf("the refused start took bytes: %v in use", got)
		}

		holder.send(body[600<<10:])
		resp, answer = holder.response()
		if msg := answerMessage(t, answer); msg != "queued" {
			t.Errorf("the held start, once sent: %d %q", resp.StatusCode, msg)
		}
		if got := metricValue(t, m, "inferd_request_body_bytes"); got != 0 {
			t.Errorf("%v bytes still counted once every body was read", got)
		}
	})
}

// TestHeldBodiesOfOneAddressAreCutForAnotherWithinItsShare: one address
// holding two large bodies that fill limits.bodyBytes (but the room a
// buffer takes to grow) does not keep another address's start out: the
// holder's older body (of two equal ones) is cut (answered at once, naming the budget, its
// connection closed), the start is served, and the holder's other body
// stays held.
func TestHeldBodiesOfOneAddressAreCutForAnotherWithinItsShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := metrics.New(vm.NewSet())
		const total = 2*(bigBody+1) + 256<<10
		env := newEnv(t, Options{Metrics: m, MaxBodyBytes: bigBody, Limits: Limits{BodyBytes: total}})
		ps := newPipeServer(t, env.h, 0)
		body := startBody(bigBody)
		first := ps.dialFrom("192.0.2.1:1")
		first.request("POST", "/start/v4", body[:600<<10], "Content-Length: "+strconv.Itoa(bigBody))
		synctest.Wait()
		second := ps.dialFrom("192.0.2.1:2")
		second.request("POST", "/start/v4", body[:600<<10], "Content-Length: "+strconv.Itoa(bigBody))
		synctest.Wait()
		if got := metricValue(t, m, "inferd_request_body_bytes"); got != 2*(bigBody+1) {
			t.Fatalf("inferd_request_body_bytes = %v, want two bodies' %d", got, 2*(bigBody+1))
		}

		// 300 KiB: its buffer's growth to 256 KiB does not fit.
		other := ps.dialFrom("192.0.2.2:1")
		other.request("POST", "/start/v4", startBody(300<<10))
		if _, answer := other.response(); answerMessage(t, answer) != "queued" {
			t.Errorf("a start from another address beside the full budget: %.200s", answer)
		}
		resp, answer := first.response()
		if msg := answerMessage(t, answer); resp.StatusCode != 200 || resp.Header.Get("Retry-After") == "" ||
			msg != "error: server busy: request bodies being read hold the 2359298 bytes they may, and this address held more than its share (limits.bodyBytes); retry later" {
			t.Errorf("the oldest held body: %d %q", resp.StatusCode, msg)
		}
		time.Sleep(time.Second) // the bubble's clock (synctest), past net/http's linger before it closes: no wall time passes
		synctest.Wait()
		if !first.closedByServer() {
			t.Error("the cut body's connection is still open")
		}
		if got := metricValue(t, m, "inferd_request_body_bytes"); got != bigBody+1 {
			t.Errorf("inferd_request_body_bytes = %v, want the second body's %d", got, bigBody+1)
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.bodyBytes"}`); n != 1 {
			t.Errorf("refusals counted: %v", n)
		}
		second.send(body[600<<10:])
		if _, answer := second.response(); answerMessage(t, answer) != "queued" {
			t.Errorf("the body left held, once sent: %s", answer)
		}
	})
}

// TestChunkedBodyIsRefusedWhenItOutgrowsTheBudget: a body of unknown length
// is counted as its buffer grows, and refused at the growth that would pass
// the budget.
func TestChunkedBodyIsRefusedWhenItOutgrowsTheBudget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, ps, body, _ := holdingPartOfABody(t)
		chunked := ps.dialFrom("192.0.2.2:1")
		part := body[:700<<10]
		chunked.request("POST", "/start/v4", strconv.FormatInt(int64(len(part)), 16)+"\r\n"+part+"\r\n",
			"Transfer-Encoding: chunked") // and never the rest
		resp, answer := chunked.response()
		if msg := answerMessage(t, answer); !strings.HasSuffix(msg, "(limits.bodyBytes); retry later") {
			t.Errorf("a chunked body outgrowing the budget: %d %q", resp.StatusCode, msg)
		}
		if got := metricValue(t, m, "inferd_request_body_bytes"); got != bigBody+1 {
			t.Errorf("inferd_request_body_bytes = %v after the refusal, want the holder's %d", got, bigBody+1)
		}
	})
}

// TestBodyBytesPerSourceRefusesOneAddressOnly: an address holding its share
// is refused more (429 with Retry-After on the project API), another
// address is not.
func TestBodyBytesPerSourceRefusesOneAddressOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := metrics.New(vm.NewSet())
		env := newEnv(t, Options{Metrics: m, Limits: Limits{BodyBytesPerSource: 100 << 10}})
		ps := newPipeServer(t, env.h, 0)
		body := startBody(60 << 10) // read into one buffer of its size
		holder := ps.dialFrom("[2001:db8::1]:1")
		holder.request("POST", "/start/v4", body[:30<<10], "Content-Length: "+strconv.Itoa(len(body)))
		synctest.Wait()

		put := `{"maxReplicas": 2, "pad": "` + strings.Repeat(" ", 40<<10) + `"}`
		same := ps.dialFrom("[2001:db8::2]:1") // the same /64
		same.request("PUT", "/v1/projects/echo", put, "X-Service-API-Key: "+keyAcme)
		resp, answer := same.response()
		if resp.StatusCode != 429 || resp.Header.Get("Retry-After") == "" || !strings.Contains(answer, "(limits.bodyBytesPerSource)") {
			t.Errorf("a PUT from the same /64: %d %s", resp.StatusCode, answer)
		}
		other := ps.dialFrom("[2001:db8:0:1::1]:1")
		other.request("PUT", "/v1/projects/echo", `{"maxReplicas": 2}`, "X-Service-API-Key: "+keyAcme)
		if resp, answer := other.response(); resp.StatusCode != 200 {
			t.Errorf("a PUT from another /64: %d %s", resp.StatusCode, answer)
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.bodyBytesPerSource"}`); n != 1 {
			t.Errorf("refusals counted: %v", n)
		}
	})
}

// TestBodyReadTimeoutRefusesASlowBody: a body not sent within
// limits.bodyReadTimeout of its headers is refused (408 on the project API,
// "error:" on start), and the deadline ends with the body: a long poll,
// whose body is in, waits past it.
func TestBodyReadTimeoutRefusesASlowBody(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := metrics.New(vm.NewSet())
		env := newEnv(t, Options{Metrics: m, LongPollWait: time.Minute, Limits: Limits{BodyReadTimeout: 10 * time.Second}})
		env.sched.add(store.Call{ID: "call_r", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
		ps := newPipeServer(t, env.h, 0)

		slowStart := ps.dial()
		slowStart.request("POST", "/start/v4", "{", "Content-Length: 100")
		slowPut := ps.dial()
		slowPut.request("PUT", "/v1/projects/echo", "{", "Content-Length: 100", "X-Service-API-Key: "+keyAcme)
		poll := ps.dial()
		poll.request("POST", "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_r", "longPoll": true}`)
		time.Sleep(11 * time.Second)

		resp, answer := slowStart.response()
		if msg := answerMessage(t, answer); resp.StatusCode != 200 ||
			!strings.HasPrefix(msg, "error: request body not received within 10s (limits.bodyReadTimeout)") {
			t.Errorf("a start whose body stalls: %d %q", resp.StatusCode, msg)
		}
		if resp, answer := slowPut.response(); resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(answer, "(limits.bodyReadTimeout)") {
			t.Errorf("a PUT whose body stalls: %d %s", resp.StatusCode, answer)
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.bodyReadTimeout"}`); n != 2 {
			t.Errorf("refusals counted: %v", n)
		}

		time.Sleep(20 * time.Second) // the poll waits on, past the body's deadline
		env.sched.finish("call_r", store.CallSucceeded, `{"ok":true}`, "success")
		if _, answer := poll.response(); answerMessage(t, answer) != "success" {
			t.Errorf("the long poll: %s", answer)
		}
	})
}
