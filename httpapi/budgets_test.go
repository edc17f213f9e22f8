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

func TestBodyBudgetCountsInAllAndPerSource(t *testing.T) {
	b := newBodyBudget(100, 60)
	refusedBy := func(err error) string {
		var be *budgetError
		if !errors.As(err, &be) {
			return ""
		}
		return be.budget
	}
	if err := b.reserve("a", 50); err != nil {
		t.Fatal(err)
	}
	if got := refusedBy(b.reserve("a", 20)); got != budgetBodyBytesPerSource {
		t.Errorf("source a past its 60: refused by %q", got)
	}
	if got := refusedBy(b.check("b", 51)); got != budgetBodyBytes {
		t.Errorf("b's 51 past the 100 in all: refused by %q", got)
	}
	if err := b.reserve("b", 50); err != nil {
		t.Errorf("b's 50 within both: %v", err)
	}
	b.release("a", 50)
	if err := b.reserve("b", 10); err != nil || b.inUse() != 60 {
		t.Errorf("after a let go: %v, %d in use", err, b.inUse())
	}
	b.release("b", 60)
	if b.inUse() != 0 || len(b.bySource) != 0 {
		t.Errorf("all given back: %d in use, %d sources kept", b.inUse(), len(b.bySource))
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

		// Its headers only: the answer comes before any of the body.
		other := ps.dialFrom("192.0.2.2:1")
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
