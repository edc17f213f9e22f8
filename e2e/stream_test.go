package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// eventStream reads one GET /v1/calls/:id/events.
type eventStream struct {
	t      *testing.T
	status int
	events chan sse // read in the background, so a test can wait with a timeout
}

type sse struct{ name, data string }

func followCall(t *testing.T, base, callID, key string) *eventStream {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/calls/"+callID+"/events", nil)
	req.Header.Set("X-Service-API-Key", key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	s := &eventStream{t: t, status: resp.StatusCode, events: make(chan sse, 64)}
	go func() {
		defer resp.Body.Close()
		defer close(s.events)
		sc := bufio.NewScanner(resp.Body)
		var ev sse
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "" && ev.name != "":
				s.events <- ev
				ev = sse{}
			case strings.HasPrefix(line, "event: "):
				ev.name = strings.TrimPrefix(line, "event: ")
			case strings.HasPrefix(line, "data: "):
				ev.data = strings.TrimPrefix(line, "data: ")
			}
		}
	}()
	return s
}

// next returns the next event other than a pending state.
func (s *eventStream) next() sse {
	s.t.Helper()
	for {
		select {
		case ev, ok := <-s.events:
			if !ok {
				s.t.Fatal("the event stream ended")
			}
			if ev.name == "state" && !strings.Contains(ev.data, "succeeded") && !strings.Contains(ev.data, "failed") {
				continue
			}
			return ev
		case <-scaledAfter(60 * time.Second):
			s.t.Fatal(testenv.Waited(60*time.Second, "the stream's next event"))
		}
	}
}

func TestStreamingModelOutputReachesSSEClientsBeforeTheCallEnds(t *testing.T) {
	t.Parallel()
	manifest, err := filepath.Abs("examples/stream/project.yaml")
	if err != nil {
		t.Fatal(err)
	}
	echoDir(t) // python3 is needed
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("demo", false)
	otherKey := d.createKey("globex", false)
	if out, err := d.cli("apply", "-f", manifest); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	gate := filepath.Join(t.TempDir(), "go-on")
	c := inferenceClient{t: t, base: d.base, key: key}
	inputs, _ := json.Marshal(map[string]any{"prompt": "alpha beta gamma", "delay": 0, "waitFor": gate})
	callID := c.start("mk-stream-1", string(inputs), true)["callID"].(string)

	first := followCall(t, d.base, callID, key)
	if first.status != 200 {
		t.Fatalf("events: HTTP %d", first.status)
	}
	if ev := first.next(); ev.name != "output" || ev.data != `{"token":"alpha","index":0}` {
		t.Fatalf("first event %v, want the first line", ev)
	}
	// The model now waits for the gate: the call cannot have ended.
	if r := c.check(callID, false); r["finished"] != false || r["message"] != "running" {
		t.Fatalf("check while streaming: %v", r)
	}
	mid := followCall(t, d.base, callID, key)
	if ev := mid.next(); ev.name != "output" || ev.data != `{"token":"alpha","index":0}` {
		t.Fatalf("a client connecting mid-stream first got %v, want the line sent so far", ev)
	}
	if other := followCall(t, d.base, callID, otherKey); other.status != http.StatusNotFound {
		t.Errorf("another team's key: HTTP %d, want 404", other.status)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	want := []string{`{"token":"beta","index":1}`, `{"token":"gamma","index":2}`, `{"done":true,"tokens":3}`}
	for _, s := range []*eventStream{first, mid} {
		for _, w := range want {
			if ev := s.next(); ev.name != "output" || ev.data != w {
				t.Fatalf("event %v, want output %s", ev, w)
			}
		}
		if ev := s.next(); ev.name != "state" || !strings.Contains(ev.data, `"succeeded"`) {
			t.Fatalf("event %v, want the final state", ev)
		}
		checkDone(t, s.next(), 4)
	}
	// A client of a finished call gets its state and done at once.
	late := followCall(t, d.base, callID, key)
	if ev := late.next(); ev.name != "state" {
		t.Fatalf("late client: %v", ev)
	}
	checkDone(t, late.next(), 4)
	// check answers the same list of lines.
	r := c.check(callID, false)
	if outs, _ := r["modelOutputs"].([]any); r["message"] != "success" || len(outs) != 4 {
		t.Errorf("check after the stream: %v", r)
	}
}

// checkDone checks a done event: success, with modelOutputs the n lines.
func checkDone(t *testing.T, ev sse, n int) {
	t.Helper()
	var done map[string]any
	if ev.name != "done" || json.Unmarshal([]byte(ev.data), &done) != nil {
		t.Fatalf("event %v, want done", ev)
	}
	outs, _ := done["modelOutputs"].([]any)
	if done["message"] != "success" || len(outs) != n {
		t.Fatalf("done %s: want success with %d lines", ev.data, n)
	}
	if first, _ := outs[0].(map[string]any); first["token"] != "alpha" {
		t.Errorf("done's first line %v", outs[0])
	}
}
