package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

// sseClient reads the events of one GET /v1/calls/:id/events.
type sseClient struct {
	t      *testing.T
	resp   *http.Response
	sc     *bufio.Scanner
	cancel context.CancelFunc
}

type sseEvent struct{ name, data string }

func openEvents(t *testing.T, base, callID, key string) *sseClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/calls/"+callID+"/events", nil)
	req.Header.Set("X-Service-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); resp.Body.Close() })
	return &sseClient{t: t, resp: resp, sc: bufio.NewScanner(resp.Body), cancel: cancel}
}

// next returns the next event, skipping comments.
func (c *sseClient) next() sseEvent {
	c.t.Helper()
	var ev sseEvent
	for c.sc.Scan() {
		line := c.sc.Text()
		switch {
		case line == "" && ev.name != "":
			return ev
		case strings.HasPrefix(line, "event: "):
			ev.name = strings.TrimPrefix(line, "event: ")
		case strings.HasPrefix(line, "data: "):
			ev.data = strings.TrimPrefix(line, "data: ")
		}
	}
	c.t.Fatalf("stream ended before the next event (%v)", c.sc.Err())
	return ev
}

func (c *sseClient) expect(name, data string) {
	c.t.Helper()
	if ev := c.next(); ev.name != name || data != "" && ev.data != data {
		c.t.Fatalf("event %s %s, want %s %s", ev.name, ev.data, name, data)
	}
}

func TestCallEventsStreamOutputLiveAndMidStreamThenDone(t *testing.T) {
	streams := NewStreams()
	env := newEnv(t, Options{Streams: streams})
	srv := httptest.NewServer(env.h)
	defer srv.Close()
	env.sched.add(store.Call{ID: "call_s", ProjectID: "echo", TeamID: "acme", State: store.CallQueued, Created: time.Now()})

	first := openEvents(t, srv.URL, "call_s", keyAcme)
	if ct := first.resp.Header.Get("Content-Type"); first.resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("HTTP %d, Content-Type %q", first.resp.StatusCode, ct)
	}
	first.expect("state", `{"callID":"call_s","state":"queued"}`)
	streams.CallRunning("call_s")
	first.expect("state", `{"callID":"call_s","state":"running"}`)
	streams.CallOutput("call_s", json.RawMessage("{\"t\":\r\n 1}"))
	first.expect("output", `{"t":1}`)

	mid := openEvents(t, srv.URL, "call_s", keyAcme)
	mid.expect("state", `{"callID":"call_s","state":"running"}`)
	mid.expect("output", `{"t":1}`)

	streams.CallOutput("call_s", json.RawMessage(`{"t":2}`))
	first.expect("output", `{"t":2}`)
	mid.expect("output", `{"t":2}`)
	env.sched.mu.Lock()
	env.sched.calls["call_s"].call.Streamed = true
	env.sched.mu.Unlock()
	env.sched.finish("call_s", store.CallSucceeded, `[{"t":1},{"t":2}]`, "success")
	for _, c := range []*sseClient{first, mid} {
		c.expect("state", `{"callID":"call_s","state":"succeeded"}`)
		ev := c.next()
		var done map[string]any
		if ev.name != "done" || json.Unmarshal([]byte(ev.data), &done) != nil {
			t.Fatalf("final event %s %s", ev.name, ev.data)
		}
		if out, _ := json.Marshal(done["modelOutputs"]); done["message"] != "success" || string(out) != `[{"t":1},{"t":2}]` {
			t.Errorf("done %s: want success with the list of lines", ev.data)
		}
		if c.sc.Scan() {
			t.Errorf("the stream went on after done: %q", c.sc.Text())
		}
	}
}

func TestCallEventsOfAFinishedCallReplayDone(t *testing.T) {
	env := newEnv(t, Options{Streams: NewStreams()})
	srv := httptest.NewServer(env.h)
	defer srv.Close()
	env.sched.add(store.Call{ID: "call_f", TeamID: "acme", State: store.CallFailed, Message: "error: model returned HTTP 500"})
	c := openEvents(t, srv.URL, "call_f", keyAcme)
	c.expect("state", `{"callID":"call_f","state":"failed"}`)
	ev := c.next()
	if ev.name != "done" || !strings.Contains(ev.data, `"message":"error: model returned HTTP 500"`) {
		t.Fatalf("event %s %s", ev.name, ev.data)
	}
}

func TestCallEventsAreTeamIsolated(t *testing.T) {
	env := newEnv(t, Options{Streams: NewStreams()})
	// Finished, so that a stream wrongly opened answers at once (done)
	// rather than waiting for the call.
	env.sched.add(store.Call{ID: "call_theirs", TeamID: "other", State: store.CallSucceeded, Message: "success"})
	for _, tc := range []struct {
		name   string
		header []string
		status int
	}{
		{"another team's call", []string{"X-Service-API-Key", keyAcme}, http.StatusNotFound},
		{"unknown call", []string{"X-Service-API-Key", keyAcme}, http.StatusNotFound},
		{"no key", nil, http.StatusUnauthorized},
	} {
		t.Run(tc.name, func(t *testing.T) {
			id := "call_theirs"
			if tc.name == "unknown call" {
				id = "call_nope"
			}
			rec := serve(env.h, "GET", "/v1/calls/"+id+"/events", "", tc.header...)
			if rec.Code != tc.status || strings.Contains(rec.Body.String(), "event:") {
				t.Errorf("HTTP %d %q, want %d and no events", rec.Code, rec.Body.String(), tc.status)
			}
		})
	}
}

func TestStoppingEndsEventStreamsAndRunWaits(t *testing.T) {
	stopping := make(chan struct{})
	env := newEnv(t, Options{Streams: NewStreams(), Stopping: stopping})
	srv := httptest.NewServer(env.h)
	defer srv.Close()
	env.sched.add(store.Call{ID: "call_r", TeamID: "acme", State: store.CallRunning})
	c := openEvents(t, srv.URL, "call_r", keyAcme)
	c.expect("state", `{"callID":"call_r","state":"running"}`)
	run := make(chan *httptest.ResponseRecorder, 1)
	go func() { run <- serve(env.h, "POST", "/run/echo/", `{}`, "X-Banana-API-Key", keyAcme) }()
	eventuallyTrue(t, func() bool {
		env.sched.mu.Lock()
		defer env.sched.mu.Unlock()
		return env.sched.n == 1 // the /run call is admitted and waited on
	})
	close(stopping)
	if c.sc.Scan() {
		t.Errorf("the event stream went on after shutdown began: %q", c.sc.Text())
	}
	if rec := waitResult(t, run); rec.Code != 503 {
		t.Errorf("/run during shutdown: HTTP %d, want 503 (the SDK retries it)", rec.Code)
	}
}

// A stream outlives the server's read and write timeouts, which are sized
// for the short waits of start and check.
func TestCallEventsOutliveTheServerTimeouts(t *testing.T) {
	streams := NewStreams()
	env := newEnv(t, Options{Streams: streams})
	srv := httptest.NewUnstartedServer(env.h)
	srv.Config.ReadTimeout, srv.Config.WriteTimeout = 200*time.Millisecond, 200*time.Millisecond
	srv.Start()
	defer srv.Close()
	env.sched.add(store.Call{ID: "call_long", TeamID: "acme", State: store.CallRunning})
	c := openEvents(t, srv.URL, "call_long", keyAcme)
	c.expect("state", `{"callID":"call_long","state":"running"}`)
	later := time.AfterFunc(time.Second, func() { streams.CallOutput("call_long", json.RawMessage(`{"late":true}`)) })
	defer later.Stop()
	c.expect("output", `{"late":true}`)
	c.cancel() // before srv.Close, which waits for the stream to end
}
