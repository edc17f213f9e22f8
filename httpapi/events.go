package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
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
//
// Its budgets: a key holds at most limits.maxStreamsPerKey streams; each
// event must reach the client within limits.streamWriteTimeout, or the
// stream is cut (a reader that does not read holds nothing for long); and
// the streams of a finished call share one copy of its result, within
// limits.streamResultBytes for all results held (stream_results.go).
func (a *api) callEvents(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.headerKeyFor(r, store.PermInfer)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	id := ps.ByName("callID")
	call, done, err := a.streamLookup(id)
	switch {
	case errors.Is(err, store.ErrNotFound) || err == nil && !mayReach(key, call.TeamID, call.ProjectID):
		writeError(w, r, a.log, errEventsCallNotFound) // the same answer whoever's it is
		return
	case err != nil:
		writeError(w, r, a.log, err)
		return
	}
	endStream, err := a.limits.beginStream(key.ID)
	if err != nil {
		a.refuseStream(w, r, err)
		return
	}
	defer endStream()
	release := func() {}
	defer func() { release() }()
	if isClosed(done) && call.State.Done() {
		if call, release, err = a.results.hold(call); err != nil {
			a.refuseStream(w, r, err)
			return
		}
	}
	a.streamsOpen.Add(1)
	defer a.streamsOpen.Add(-1)
	running, backlog, sub, cancel := a.opts.Streams.subscribe(id)
	defer cancel()

	rc := http.NewResponseController(w)
	ev := sseWriter{w: w, rc: rc, timeout: a.opts.Limits.StreamWriteTimeout}
	if ev.timeout <= 0 {
		_ = rc.SetWriteDeadline(time.Time{}) // the stream lasts as long as the call
	}
	defer func() {
		if ev.cut() {
			a.refused(budgetStreamWriteTimeout)
		}
	}()
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx would otherwise hold events back
	w.WriteHeader(http.StatusOK)

	if !isClosed(done) {
		var ok bool
		if call, release, ok = a.followEvents(r, &ev, call, done, running, backlog, sub.ch); !ok {
			return
		}
	}
	ev.state(id, call.State)
	// One line of SSE data: the outputs with their line breaks as spaces
	// (JSON allows them only between tokens), written from the copy all
	// the call's streams share.
	resp := a.callResponse(call, reachesOf(key))
	ev.answer("done", resp.ownAnswer())
	ev.flush()
}

// followEvents sends a running call's state, the lines it sent so far and
// then each as it comes, until the call is done, and returns the call as it
// then stands, its result held for the done event (release frees it). It
// reports false when the stream ended first: the client left, inferd stops
// (the client reconnects to the restarted daemon), a write failed, or the
// result could not be held (limits.streamResultBytes: the stream ends
// without done, saying why, and the client reconnects or checks the call).
func (a *api) followEvents(r *http.Request, ev *sseWriter, call store.Call, done <-chan struct{}, running bool,
	backlog []json.RawMessage, events <-chan streamEvent) (store.Call, func(), bool) {
	id := call.ID
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
	for !isClosed(done) {
		select {
		case e, ok := <-events:
			if !ok {
				events = nil // fell behind: done still carries every line
				continue
			}
			ev.event(e, id)
		case <-done:
			drain(events, func(e streamEvent) { ev.event(e, id) }) // lines sent before the end
		case <-ka.C:
			ev.comment("keep-alive")
		case <-r.Context().Done():
			return call, nil, false
		case <-a.opts.Stopping:
			return call, nil, false
		}
		ev.flush()
		if ev.err != nil {
			return call, nil, false
		}
	}
	if c, _, err := a.streamLookup(id); err == nil {
		call = c
	}
	if !call.State.Done() {
		return call, func() {}, true
	}
	call, release, err := a.results.hold(call)
	if err != nil {
		a.refused(budgetStreamResultBytes)
		ev.comment("result not sent: " + err.Error())
		ev.flush()
		return call, nil, false
	}
	return call, release, true
}

// drain hands fn the events already waiting on events (nil: none), and
// returns once none is, reporting whether events is still open (false: the
// subscriber fell behind and was dropped).
func drain(events <-chan streamEvent, fn func(streamEvent)) (open bool) {
	for events != nil {
		select {
		case e, ok := <-events:
			if !ok {
				return false
			}
			fn(e)
		default:
			return true
		}
	}
	return false
}

// streamLookup returns call id as a stream needs it: the copy that other
// streams of the finished call hold, or the scheduler's.
func (a *api) streamLookup(id string) (store.Call, <-chan struct{}, error) {
	if c, ok := a.results.peek(id); ok {
		return c, closedDone, nil
	}
	return a.sched.Lookup(id)
}

// closedDone is the completion signal of a call known to be finished.
var closedDone = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// refuseStream answers a stream refused by a budget before it began.
func (a *api) refuseStream(w http.ResponseWriter, r *http.Request, err error) {
	if be, ok := err.(*budgetError); ok {
		a.refused(be.budget)
	}
	setRetryAfter(w, err)
	writeError(w, r, a.log, err)
}

// streamChunk is the most one write deadline covers: a large event (the
// done of a large result) is written in pieces of it, each within the
// timeout. A reader slower than that (1 MiB per 30 s by default, about
// 35 KB/s: any real link) is cut, as is one that does not read at all,
// while a large result still reaches a slow reader that reads.
const streamChunk = 1 << 20

// sseWriter writes Server-Sent Events and remembers the first write error.
// Each event, and each streamChunk of a large one, must be written within
// timeout (0: no limit), so that a client that does not read is cut off
// rather than waited on.
type sseWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	sent    int // bytes written under the current deadline
	err     error
}

// begin starts an event: its write deadline. It reports whether the stream
// still stands.
func (s *sseWriter) begin() bool {
	if s.err != nil {
		return false
	}
	s.renew()
	return true
}

// renew sets a fresh write deadline.
func (s *sseWriter) renew() {
	if s.timeout > 0 {
		_ = s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
	}
	s.sent = 0
}

// cut reports whether the stream ended for a client too slow to read it.
func (s *sseWriter) cut() bool { return errors.Is(s.err, os.ErrDeadlineExceeded) }

// write writes b, renewing the deadline each streamChunk.
func (s *sseWriter) write(b []byte) {
	for s.err == nil && len(b) > 0 {
		if s.sent >= streamChunk {
			s.renew() // the next chunk's deadline
		}
		n := min(len(b), streamChunk-s.sent)
		_, s.err = s.w.Write(b[:n])
		s.sent += n
		b = b[n:]
	}
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
	if s.begin() {
		_, s.err = fmt.Fprintf(s.w, "event: %s\ndata: %s\n\n", event, data)
	}
}

// answer sends an inference answer as one line of data, written in place:
// a large result is not copied per stream.
func (s *sseWriter) answer(event string, ans answer) {
	if !s.begin() {
		return
	}
	s.write([]byte("event: " + event + "\ndata: "))
	s.write(ans.head)
	s.writeOneLine(ans.outputs)
	s.write(ans.tail)
	s.write([]byte("\n\n"))
}

// writeOneLine writes JSON b with each CR and LF as a space: SSE data must
// not break its line, and JSON has them only as whitespace between tokens.
func (s *sseWriter) writeOneLine(b []byte) {
	for len(b) > 0 && s.err == nil {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			s.write(b)
			return
		}
		s.write(b[:i])
		s.write(space)
		b = b[i+1:]
	}
}

var space = []byte(" ")

func (s *sseWriter) comment(text string) {
	if s.begin() {
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
