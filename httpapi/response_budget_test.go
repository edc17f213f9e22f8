package httpapi

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// openSilentResponse asks for a call's result on GET
// /v1/calls/ID/response and never reads the answer.
func openSilentResponse(ps *pipeServer, callID, key string) *pipeClient {
	c := ps.dial()
	c.request("GET", "/v1/calls/"+callID+"/response", "", "X-Service-API-Key: "+key)
	return c
}

// TestResponseReadersOfOneResultShareOneCopy: 30 readers of one result on
// GET /v1/calls/ID/response that never read hold it once (counted once in
// limits.streamResultBytes, as event streams do) and allocate no copy each
// (issue 41: a copy per reader, 20 readers of a 60 MiB result took the
// daemon to 1.43 GB); at limits.streamWriteTimeout each is cut and the
// result let go, and a reader that reads gets the result whole.
func TestResponseReadersOfOneResultShareOneCopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const readers = 30
		m, ps, result := finishedCallServer(t, Limits{StreamResultBytes: 2 << 20, StreamWriteTimeout: 30 * time.Second}, 1<<20)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		silent := make([]*pipeClient, readers)
		for i := range silent {
			silent[i] = openSilentResponse(ps, "call_big", keyAcme)
		}
		synctest.Wait()
		runtime.ReadMemStats(&after)
		if b := metricValue(t, m, "inferd_event_stream_result_bytes"); int(b) != len(result) {
			t.Errorf("%d silent readers hold %v result bytes; want the one result's %d", readers, b, len(result))
		}
		if got := after.TotalAlloc - before.TotalAlloc; got > uint64(readers*len(result)/4) {
			t.Errorf("%d readers allocated %d bytes for a %d-byte result: a copy each", readers, got, len(result))
		}

		reader := ps.dial()
		reader.request("GET", "/v1/calls/call_big/response", "", "X-Service-API-Key: "+keyAcme)
		resp, body := reader.response()
		var got map[string]string
		if resp.StatusCode != 200 || json.Unmarshal([]byte(body), &got) != nil || len(got["data"]) != 1<<20 {
			t.Errorf("a reader that reads: %d, %d bytes: %.100s", resp.StatusCode, len(body), body)
		}

		time.Sleep(31 * time.Second) // the bubble's clock (synctest), past limits.streamWriteTimeout: no wall time passes
		synctest.Wait()
		if b := metricValue(t, m, "inferd_event_stream_result_bytes"); b != 0 {
			t.Errorf("past the write timeout the silent readers hold %v result bytes; want none", b)
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.streamWriteTimeout"}`); n != readers {
			t.Errorf("cuts counted: %v, want %d", n, readers)
		}
		for i, c := range silent {
			if !c.closedByServer() {
				t.Fatalf("silent reader %d is still connected past the write timeout", i)
			}
		}
	})
}

// TestResponseBudgetRefusalNamesIt: a reader of a second large result,
// while a silent reader holds the first within limits.streamResultBytes,
// is refused 503 naming the budget; the first's next reader shares it.
func TestResponseBudgetRefusalNamesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		env := newEnv(t, Options{Limits: Limits{StreamResultBytes: 1500 << 10}})
		for _, id := range []string{"call_a", "call_b"} {
			env.sched.add(store.Call{ID: id, ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded,
				Message: "success", Outputs: json.RawMessage(bigResult(1 << 20))})
		}
		ps := newPipeServer(t, env.h, 0)
		openSilentResponse(ps, "call_a", keyAcme)
		synctest.Wait()
		b := ps.dial()
		b.request("GET", "/v1/calls/call_b/response", "", "Authorization: Bearer "+keyAcme)
		resp, body := b.response()
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(body, "results being sent hold the") || !strings.Contains(body, "(limits.streamResultBytes)") {
			t.Errorf("a reader of another large result: %d %.300s", resp.StatusCode, body)
		}
		a := ps.dial()
		a.request("GET", "/v1/calls/call_a/response", "", "Authorization: Bearer "+keyAcme)
		if resp, body := a.response(); resp.StatusCode != 200 || len(body) < 1<<20 {
			t.Errorf("a second reader of the held result: %d, %d bytes", resp.StatusCode, len(body))
		}
	})
}
