package httpapi

import (
	"bufio"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"inferd/httpapi/metrics"
	"inferd/store"
)

// bigResult is a model reply of about n bytes with line breaks in it, as a
// pretty-printing model writes them.
func bigResult(n int) string {
	return "{\r\n  \"data\": \"" + strings.Repeat("x", n) + "\"\n}"
}

// openSilentStream opens an event stream whose client never reads.
func openSilentStream(ps *pipeServer, callID, key string) *pipeClient {
	c := ps.dial()
	c.request("GET", "/v1/calls/"+callID+"/events", "", "X-Service-API-Key: "+key)
	return c
}

// finishedCallServer serves, with the limits given, a finished call
// call_big of acme's whose result is bigResult(n), and returns the metrics,
// the server and that result. Call it in a synctest bubble.
func finishedCallServer(t *testing.T, limits Limits, n int) (*metrics.Metrics, *pipeServer, string) {
	m := metrics.New(vm.NewSet())
	env := newEnv(t, Options{Metrics: m, Streams: NewStreams(), Limits: limits})
	result := bigResult(n)
	env.sched.add(store.Call{ID: "call_big", ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded,
		Message: "success", Outputs: json.RawMessage(result)})
	return m, newPipeServer(t, env.h, 0), result
}

// TestSilentEventStreamIsCutAtTheWriteTimeout: a client that opens a
// stream and never reads holds its stream, and the result, for
// limits.streamWriteTimeout at most: then the stream is cut, the result let
// go, and the cut counted.
func TestSilentEventStreamIsCutAtTheWriteTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, ps, result := finishedCallServer(t, Limits{StreamWriteTimeout: 30 * time.Second}, 100<<10)
		silent := openSilentStream(ps, "call_big", keyAcme)
		synctest.Wait()
		if n, b := metricValue(t, m, "inferd_event_streams"), metricValue(t, m, "inferd_event_stream_result_bytes"); n != 1 || int(b) != len(result) {
			t.Fatalf("while the stream waits on its reader: %v streams, %v result bytes; want 1 and %d", n, b, len(result))
		}
		time.Sleep(29 * time.Second)
		synctest.Wait()
		if n := metricValue(t, m, "inferd_event_streams"); n != 1 {
			t.Fatalf("the stream was cut before its write timeout")
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if n, b := metricValue(t, m, "inferd_event_streams"), metricValue(t, m, "inferd_event_stream_result_bytes"); n != 0 || b != 0 {
			t.Errorf("past the write timeout: %v streams, %v result bytes; want none", n, b)
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.streamWriteTimeout"}`); n != 1 {
			t.Errorf("cuts counted: %v", n)
		}
		if !silent.closedByServer() {
			t.Error("the silent stream's connection is still open")
		}
	})
}

// TestEventStreamsOfOneResultShareOneCopy: 30 streams of one finished call
// hold its result once (counted once against limits.streamResultBytes) and
// write it in place, not a copy each (they used to compact it and encode it
// again per stream: 2.3 GB for 30 streams of a 60 MiB result); a reader
// gets the answer on one line, its line breaks as spaces.
func TestEventStreamsOfOneResultShareOneCopy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const streams = 30
		m, ps, result := finishedCallServer(t, Limits{StreamResultBytes: 2 << 20}, 1<<20)
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		for range streams {
			openSilentStream(ps, "call_big", keyAcme)
		}
		synctest.Wait()
		runtime.ReadMemStats(&after)
		if n, b := metricValue(t, m, "inferd_event_streams"), metricValue(t, m, "inferd_event_stream_result_bytes"); n != streams || int(b) != len(result) {
			t.Errorf("%v streams hold %v result bytes; want %d holding the one result of %d", n, b, streams, len(result))
		}
		// What the streams allocated is their own state (buffers of a few
		// KiB each), far from a copy of the result each.
		if got := after.TotalAlloc - before.TotalAlloc; got > uint64(streams*len(result)/4) {
			t.Errorf("%d streams allocated %d bytes for a %d-byte result", streams, got, len(result))
		}

		reader := ps.dial()
		reader.request("GET", "/v1/calls/call_big/events", "", "X-Service-API-Key: "+keyAcme)
		resp, err := http.ReadResponse(reader.r, nil)
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("a reading stream: %v %v", resp, err)
		}
		sc := bufio.NewScanner(resp.Body)
		sc.Buffer(nil, 4<<20)
		var done string
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok && strings.Contains(d, `"modelOutputs"`) {
				done = d
			}
		}
		var answer struct {
			Message      string
			ModelOutputs []map[string]string
		}
		if err := json.Unmarshal([]byte(done), &answer); err != nil || answer.Message != "success" ||
			len(answer.ModelOutputs) != 1 || len(answer.ModelOutputs[0]["data"]) != 1<<20 {
			t.Errorf("the done event is not the answer with the result (%v): %.200s", err, done)
		}
	})
}

// TestEventStreamsPerKeyCap: a key holds limits.maxStreamsPerKey streams,
// and is refused the next (429 naming the budget); another key is not.
func TestEventStreamsPerKeyCap(t *testing.T) {
	m := metrics.New(vm.NewSet())
	env := newEnv(t, Options{Metrics: m, Streams: NewStreams(), Limits: Limits{MaxStreamsPerKey: 2}})
	env.sched.add(store.Call{ID: "call_r", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
	srv := httptest.NewServer(env.h)
	t.Cleanup(srv.Close) // after the streams' own cleanups end them
	for range 2 {
		openEvents(t, srv.URL, "call_r", keyAcme).expect("state", "")
	}
	third := openEvents(t, srv.URL, "call_r", keyAcme)
	if third.resp.StatusCode != 429 {
		t.Fatalf("a third stream of the key: %d, want 429", third.resp.StatusCode)
	}
	body, _ := io.ReadAll(third.resp.Body)
	if third.resp.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "(limits.maxStreamsPerKey)") {
		t.Errorf("the refusal of a third stream: %s (Retry-After %q)", body, third.resp.Header.Get("Retry-After"))
	}
	openEvents(t, srv.URL, "call_r", keyAdmin).expect("state", "")
	if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.maxStreamsPerKey"}`); n != 1 {
		t.Errorf("refusals counted: %v", n)
	}
}

// TestStreamResultBytesBoundsTheResultsHeld: with one result held by a
// silent stream, a stream of another result that would pass
// limits.streamResultBytes is refused (503 naming the budget) while one of
// the same result shares it; a call that finishes while its stream is open
// and whose result does not fit ends its stream without done, saying why.
func TestStreamResultBytesBoundsTheResultsHeld(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := metrics.New(vm.NewSet())
		env := newEnv(t, Options{Metrics: m, Streams: NewStreams(), Limits: Limits{StreamResultBytes: 1500 << 10}})
		for _, id := range []string{"call_a", "call_b"} {
			env.sched.add(store.Call{ID: id, ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded,
				Message: "success", Outputs: json.RawMessage(bigResult(1 << 20))})
		}
		env.sched.add(store.Call{ID: "call_c", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
		ps := newPipeServer(t, env.h, 0)
		openSilentStream(ps, "call_a", keyAcme)
		live := ps.dial()
		live.request("GET", "/v1/calls/call_c/events", "", "X-Service-API-Key: "+keyAcme)
		liveResp, err := http.ReadResponse(live.r, nil)
		if err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		b := ps.dial()
		b.request("GET", "/v1/calls/call_b/events", "", "X-Service-API-Key: "+keyAcme)
		if resp, body := b.response(); resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" ||
			!strings.Contains(body, "(limits.streamResultBytes)") {
			t.Errorf("a stream of another large result: %d %s", resp.StatusCode, body)
		}
		openSilentStream(ps, "call_a", keyAcme)
		synctest.Wait()
		if n := metricValue(t, m, "inferd_event_streams"); n != 3 {
			t.Errorf("%v streams open, want 3: two of call_a sharing its result, one of call_c", n)
		}

		env.sched.finish("call_c", store.CallSucceeded, bigResult(1<<20), "success")
		tail := new(strings.Builder)
		sc := bufio.NewScanner(liveResp.Body)
		for sc.Scan() {
			tail.WriteString(sc.Text() + "\n")
		}
		if got := tail.String(); strings.Contains(got, "event: done") || !strings.Contains(got, ": result not sent: ") ||
			!strings.Contains(got, "(limits.streamResultBytes)") {
			t.Errorf("the end of a stream whose result does not fit:\n%s", got)
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.streamResultBytes"}`); n != 2 {
			t.Errorf("refusals counted: %v", n)
		}
	})
}

// TestSlowReaderOfALargeResultGetsItWhole: a reader that takes 1 MiB every
// 20 s gets a 3 MiB done event whole, though it takes longer than
// limits.streamWriteTimeout (30 s): the deadline covers each MiB, not the
// whole result.
func TestSlowReaderOfALargeResultGetsItWhole(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m, ps, _ := finishedCallServer(t, Limits{StreamWriteTimeout: 30 * time.Second}, 3<<20)
		c := openSilentStream(ps, "call_big", keyAcme)
		var got strings.Builder
		buf := make([]byte, 64<<10)
		start := time.Now()
		for paced := 0; !strings.Contains(got.String(), "}]}\n\n"); {
			n, err := c.r.Read(buf)
			got.Write(buf[:n])
			if err != nil {
				break // the end of the stream
			}
			if paced += n; paced >= 1<<20 {
				paced = 0
				time.Sleep(20 * time.Second) // the reader's pace, 1 MiB per 20 s, on the bubble's clock
			}
		}
		// The raw stream is chunked: the result's x are counted, not matched.
		_, done, _ := strings.Cut(got.String(), "event: done")
		if took := time.Since(start); took <= 30*time.Second || strings.Count(done, "x") != 3<<20 {
			t.Errorf("after %v the reader has %d bytes, not the whole done event", took, got.Len())
		}
		if n := metricValue(t, m, `inferd_budget_refusals_total{budget="limits.streamWriteTimeout"}`); n != 0 {
			t.Errorf("the slow reader was cut (%v)", n)
		}
	})
}
