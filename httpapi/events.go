package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/store"
)

// sseKeepAlive is how often an idle event stream gets a comment line, so
// that proxies and clients do not take a long call for a dead connection.
const sseKeepAlive = 15 * time.Second

// errEventsCallNotFound never names the call: another team's answers
// exactly as one that does not exist.
var errEventsCallNotFound = notFound("call not found (unknown, expired, or not yours)")

// callEvents handles GET /v1/calls/:callID/events: Server-Sent Events of
// one call of the caller's team. state events give the call's state (on
// connect, and when a replica takes it), output events each line a
// streaming model sends (those sent before the client connected first),
// and a final done event carries the check answer; then the stream ends.
// A finished call answers its state and done at once.
func (a *api) callEvents(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.headerKeyFor(r, store.PermInfer)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	id := ps.ByName("callID")
	call, done, err := a.sched.Lookup(id)
	switch {
	case errors.Is(err, store.ErrNotFound) || err == nil && !mayReach(key, call.TeamID, call.ProjectID):
		writeError(w, r, a.log, errEventsCallNotFound) // the same answer whoever's it is
		return
	case err != nil:
		writeError(w, r, a.log, err)
		return
	}
	release, ok := a.limits.beginWait(key.ID)
	if !ok {
		writeError(w, r, a.log, &userError{http.StatusTooManyRequests, codeRateLimited,
			"too many requests of this API key are waiting; close some and retry"})
		return
	}
	defer release()
	running, backlog, sub, cancel := a.opts.Streams.subscribe(id)
	defer cancel()

	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // the stream lasts as long as the call
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx would otherwise hold events back
	w.WriteHeader(http.StatusOK)
	ev := sseWriter{w: w, rc: rc}

	if !isClosed(done) {
		state := call.State
		if running {
			state = store.CallRunning
		}
		ev.state(id, state)
		for _, line := range backlog {
			ev.output(line)
		}
		ev.flush()
		ka := time.NewTicker(sseKeepAlive)
		defer ka.Stop()
		events := sub.ch
	wait:
		for {
			select {
			case e, ok := <-events:
				if !ok {
					events = nil // fell behind: done still carries every line
					continue
				}
				ev.event(e, id)
			case <-done:
				for drained := false; !drained && events != nil; { // lines sent before the end
					select {
					case e, ok := <-events:
						if !ok {
							drained = true
							break
						}
						ev.event(e, id)
					default:
						drained = true
					}
				}
				break wait
			case <-ka.C:
				ev.comment("keep-alive")
			case <-r.Context().Done():
				return
			case <-a.opts.Stopping:
				return // the client reconnects to the restarted daemon
			}
			ev.flush()
			if ev.err != nil {
				return
			}
		}
	}
	if c, _, err := a.sched.Lookup(id); err == nil {
		call = c
	}
	ev.state(id, call.State)
	// One line of SSE data: the outputs compacted, since a model's reply
	// may hold newlines.
	resp := a.callResponse(call)
	var cerr error
	if len(resp.outputs) > 0 {
		var compact bytes.Buffer
		cerr = json.Compact(&compact, resp.outputs)
		resp.outputs = compact.Bytes()
	}
	var b []byte
	if ans, aerr := resp.answer(resp); cerr == nil && aerr == nil {
		b = ans.Bytes()
	} else {
		b, _ = json.Marshal(a.newResponse("error: internal error: the model's reply could not be encoded as JSON", id))
	}
	ev.send("done", b)
	ev.flush()
}

// sseWriter writes Server-Sent Events and remembers the first write error.
type sseWriter struct {
	w   http.ResponseWriter
	rc  *http.ResponseController
	err error
}

func (s *sseWriter) event(e streamEvent, id string) {
	if e.output == nil {
		s.state(id, store.CallRunning)
		return
	}
	s.output(e.output)
}

// stateEvent is the data of a state event. A pending state is named as
// check names it (never with "error" in it).
type stateEvent struct {
	CallID string `json:"callID"`
	State  string `json:"state"`
}

func (s *sseWriter) state(id string, st store.CallState) {
	name := string(st)
	if !st.Done() {
		name = pendingMessage(store.Call{State: st})
	}
	b, _ := json.Marshal(stateEvent{id, name})
	s.send("state", b)
}

// output sends one line, compacted: SSE data must not hold a line break,
// which JSON allows between tokens.
func (s *sseWriter) output(line json.RawMessage) {
	var buf bytes.Buffer
	if err := json.Compact(&buf, line); err != nil {
		return // the protocol client sends only valid JSON
	}
	s.send("output", buf.Bytes())
}

func (s *sseWriter) send(event string, data []byte) {
	if s.err == nil {
		_, s.err = fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", event, data)
	}
}

func (s *sseWriter) comment(text string) {
	if s.err == nil {
		_, s.err = fmt.Fprintf(s.w, ": %s\n\n", text)
	}
}

func (s *sseWriter) flush() {
	if s.err == nil {
		s.err = s.rc.Flush()
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
