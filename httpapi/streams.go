package httpapi

import (
	"encoding/json"
	"sync"

	"inferd/scheduler"
	"inferd/store"
)

// Bounds of what Streams keeps per call.
const (
	// streamBacklogBytes caps the output lines a running call keeps for
	// clients that connect mid-stream; lines beyond it still reach the
	// clients already connected, and every line is in the done event.
	streamBacklogBytes = 8 << 20
	// subscriberBuffer is how many events a slow client may fall behind by
	// before it misses output events (it still gets done).
	subscriberBuffer = 1024
)

// Streams carries the live events of running calls to the clients of
// GET /v1/calls/:callID/events: it is the scheduler's OutputSink, and hears
// of finished calls beside the metrics (CallFinished). It never blocks the
// goroutines that report to it: a client too slow to keep up loses its
// output events, not the call its progress.
type Streams struct {
	mu    sync.Mutex
	calls map[string]*liveCall
}

var _ scheduler.OutputSink = (*Streams)(nil)

// liveCall is what Streams holds of one call: created by its running or by
// its first client, dropped when it finishes or, not running, its last
// client leaves.
type liveCall struct {
	running bool
	lines   []json.RawMessage
	bytes   int
	subs    map[*subscriber]struct{}
}

// streamEvent is one SSE event for a client: output (a line) or state
// (running).
type streamEvent struct {
	output json.RawMessage // nil: the call started running
}

type subscriber struct {
	ch chan streamEvent // closed when the client fell behind
}

// NewStreams returns an empty Streams.
func NewStreams() *Streams { return &Streams{calls: map[string]*liveCall{}} }

func (s *Streams) live(id string) *liveCall {
	lc := s.calls[id]
	if lc == nil {
		lc = &liveCall{subs: map[*subscriber]struct{}{}}
		s.calls[id] = lc
	}
	return lc
}

// CallRunning implements scheduler.OutputSink. A call run again (after its
// replica died before it got it) starts its output afresh.
func (s *Streams) CallRunning(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lc := s.live(id)
	lc.running, lc.lines, lc.bytes = true, nil, 0
	lc.send(streamEvent{})
}

// CallOutput implements scheduler.OutputSink.
func (s *Streams) CallOutput(id string, line json.RawMessage) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lc := s.live(id)
	if lc.bytes+len(line) <= streamBacklogBytes {
		lc.lines = append(lc.lines, line)
		lc.bytes += len(line)
	}
	lc.send(streamEvent{output: line})
}

// CallFinished drops what Streams held of a call; its clients learn of the
// end from the call's completion signal.
func (s *Streams) CallFinished(c store.Call) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.calls, c.ID)
}

// send hands ev to every client, dropping those that fell behind. Callers
// hold s.mu.
func (lc *liveCall) send(ev streamEvent) {
	for sub := range lc.subs {
		select {
		case sub.ch <- ev:
		default:
			close(sub.ch)
			delete(lc.subs, sub)
		}
	}
}

// subscribe registers a client of call id and returns whether the call is
// running, the lines it has streamed so far, and the client's events;
// cancel unregisters it.
func (s *Streams) subscribe(id string) (running bool, backlog []json.RawMessage, sub *subscriber, cancel func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lc := s.live(id)
	sub = &subscriber{ch: make(chan streamEvent, subscriberBuffer)}
	lc.subs[sub] = struct{}{}
	return lc.running, append([]json.RawMessage(nil), lc.lines...), sub, func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if cur := s.calls[id]; cur != nil {
			delete(cur.subs, sub)
			if len(cur.subs) == 0 && !cur.running {
				delete(s.calls, id)
			}
		}
	}
}
