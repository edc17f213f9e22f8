package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"testing/synctest"

	vm "github.com/VictoriaMetrics/metrics"

	"inferd/httpapi/metrics"
	"inferd/store"
)

// TestConnLimitClosesASlowBodySenderBeforeAnIdleConnection: a connection
// that has sent its headers and is still sending its body (here one byte of
// a 1000-byte start) is closed to make room before one idle between
// requests. It used to count as being served, so that 15,200 of them held
// every connection and /healthz went unanswered.
func TestConnLimitClosesASlowBodySenderBeforeAnIdleConnection(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newEnv(t, Options{})
		ps := newPipeServer(t, env.h, 2)
		idle := ps.dial()
		idle.request("GET", "/healthz", "")
		if resp, _ := idle.response(); resp.StatusCode != 200 {
			t.Fatalf("healthz: %d", resp.StatusCode)
		}
		slow := ps.dial()
		slow.request("POST", "/start/v4", "{", "Content-Length: 1000") // and never the rest
		synctest.Wait()
		if st := ps.lim.Stats(); st.Open != 2 || st.Sending != 1 {
			t.Fatalf("stats %+v, want 2 open, 1 of them sending", st)
		}

		next := ps.dial()
		synctest.Wait()
		if !slow.closedByServer() {
			t.Error("the slow body sender is still open")
		}
		next.request("GET", "/healthz", "")
		if resp, _ := next.response(); resp.StatusCode != 200 {
			t.Errorf("the new connection's request: %d", resp.StatusCode)
		}
		idle.request("GET", "/healthz", "")
		if resp, _ := idle.response(); resp.StatusCode != 200 {
			t.Errorf("the idle connection's next request: %d", resp.StatusCode)
		}
		if st := ps.lim.Stats(); st.Shed != 1 || st.Open != 2 {
			t.Errorf("stats %+v, want 1 closed for room and 2 open", st)
		}
	})
}

// TestConnLimitKeepsSlotsForTheProbesWhileEveryConnectionIsServed: with the
// cap full of connections being served (an event stream here), a new
// connection still gets /healthz and /metrics answered, on a reserved slot
// that then closes; anything else on such a slot is refused naming the
// budget (HTTP 200 with "error:" on the inference API), and no connection
// being served is closed for room.
func TestConnLimitKeepsSlotsForTheProbesWhileEveryConnectionIsServed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := metrics.New(vm.NewSet())
		env := newEnv(t, Options{Metrics: m, Streams: NewStreams()})
		env.sched.add(store.Call{ID: "call_r", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
		ps := newPipeServer(t, env.h, 1)
		busy := ps.dial()
		busy.request("GET", "/v1/calls/call_r/events", "", "X-Service-API-Key: "+keyAcme)
		if resp, err := http.ReadResponse(busy.r, nil); err != nil || resp.StatusCode != 200 {
			t.Fatalf("event stream: %v %v", resp, err)
		}

		for _, path := range []string{"/healthz", "/metrics"} {
			probe := ps.dial()
			probe.request("GET", path, "")
			resp, body := probe.response()
			if resp.StatusCode != 200 || !resp.Close {
				t.Errorf("%s on a reserved slot: %d (close %v) %s", path, resp.StatusCode, resp.Close, body)
			}
			synctest.Wait()
			if !probe.closedByServer() {
				t.Errorf("the reserved connection of %s stayed open", path)
			}
		}

		other := ps.dial()
		other.request("GET", "/v1/projects", "", "X-Service-API-Key: "+keyAcme)
		resp, body := other.response()
		if resp.StatusCode != 503 || !strings.Contains(body, "(limits.maxConnections)") || resp.Header.Get("Retry-After") == "" {
			t.Errorf("the project API on a reserved slot: %d %s (Retry-After %q)", resp.StatusCode, body, resp.Header.Get("Retry-After"))
		}
		check := ps.dial()
		check.request("POST", "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_r"}`)
		resp, body = check.response()
		var answer struct{ Message string }
		if err := json.Unmarshal([]byte(body), &answer); err != nil || resp.StatusCode != 200 ||
			!strings.HasPrefix(answer.Message, "error: server busy") || !strings.Contains(answer.Message, "(limits.maxConnections)") {
			t.Errorf("a check on a reserved slot: %d %s", resp.StatusCode, body)
		}
		if st := ps.lim.Stats(); st.Shed != 0 {
			t.Errorf("stats %+v: a connection being served was closed for room", st)
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.maxConnections"}`); n != 2 {
			t.Errorf("refusals counted: %v, want 2", n)
		}
	})
}

// TestReservedSlotsMakeRoomForTheNextProbe: a reserved connection that has
// sent nothing makes room for the next, so silent connections cannot hold
// the reserve either.
func TestReservedSlotsMakeRoomForTheNextProbe(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newEnv(t, Options{Streams: NewStreams()})
		env.sched.add(store.Call{ID: "call_r", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
		ps := newPipeServer(t, env.h, 1)
		busy := ps.dial()
		busy.request("GET", "/v1/calls/call_r/events", "", "X-Service-API-Key: "+keyAcme)
		if _, err := http.ReadResponse(busy.r, nil); err != nil {
			t.Fatal(err)
		}
		var silent []*pipeClient
		for range 2 * ProbeSlots {
			silent = append(silent, ps.dial())
		}
		probe := ps.dial()
		synctest.Wait()
		probe.request("GET", "/healthz", "")
		if resp, _ := probe.response(); resp.StatusCode != 200 {
			t.Errorf("healthz behind %d silent connections on the reserve: %d", len(silent), resp.StatusCode)
		}
		if st := ps.lim.Stats(); st.Shed != int64(len(silent)+1-ProbeSlots) || st.Reserved > ProbeSlots {
			t.Errorf("stats %+v, want %d silent ones closed and at most %d reserved", st, len(silent)+1-ProbeSlots, ProbeSlots)
		}
		if busy.closedByServer() {
			t.Error("the event stream was closed for room")
		}
	})
}

// metricValue returns the sample series (name and labels as written) of a
// scrape of m; the series must be there.
func metricValue(t *testing.T, m *metrics.Metrics, series string) float64 {
	t.Helper()
	v, ok := parseExposition(t, scrape(m))[series]
	if !ok {
		t.Fatalf("the scrape has no %s", series)
	}
	return v
}
