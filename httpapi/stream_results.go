package httpapi

import (
	"sync"

	"inferd/store"
)

// streamResults lets the event streams of a finished call share one copy of
// its result, and bounds the bytes of results that streams hold
// (limits.streamResultBytes). A stream holds its result from the moment it
// has it until its done event is written or cut off (limits.
// streamWriteTimeout): 30 streams of a 60 MiB result hold one 60 MiB copy,
// where each held its own, compacted and then encoded again (2.3 GB in all).
// A result is counted once, however many streams share it. A result is
// final, so a shared copy is never stale; a call that expires while streams
// hold it is still answered to streams that open meanwhile, until the last
// one lets go (a stream holds it only while it writes its done event). It
// is safe for concurrent use.
type streamResults struct {
	max int64 // 0: no cap

	mu    sync.Mutex
	held  map[string]*heldResult
	bytes int64
}

// heldResult is a finished call some stream holds, and how many do.
type heldResult struct {
	call store.Call
	refs int
}

func newStreamResults(max int64) *streamResults {
	return &streamResults{max: max, held: map[string]*heldResult{}}
}

// peek returns finished call id as the streams that hold it have it; ok is
// false when none does. It takes no share: hold does, and counts the result
// again should the last share have gone meanwhile.
func (s *streamResults) peek(id string) (c store.Call, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[id]; h != nil {
		return h.call, true
	}
	return store.Call{}, false
}

// hold keeps c, a finished call just read, for one stream: it joins the copy
// that other streams hold, if any (c is then dropped), or counts c's result
// against the cap, or is refused when it would pass the cap.
func (s *streamResults) hold(c store.Call) (store.Call, func(), error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if h := s.held[c.ID]; h != nil {
		h.refs++
		return h.call, s.releaser(c.ID), nil
	}
	size := int64(len(c.Outputs))
	if s.max > 0 && s.bytes+size > s.max {
		return store.Call{}, nil, errStreamResultBytes(s.max)
	}
	s.held[c.ID] = &heldResult{call: c, refs: 1}
	s.bytes += size
	return c, s.releaser(c.ID), nil
}

// releaser returns the release of one share of id's result, which lets the
// result go with the last share.
func (s *streamResults) releaser(id string) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			s.mu.Lock()
			defer s.mu.Unlock()
			h := s.held[id]
			if h.refs--; h.refs == 0 {
				s.bytes -= int64(len(h.call.Outputs))
				delete(s.held, id)
			}
		})
	}
}

// inUse returns the bytes of results held now.
func (s *streamResults) inUse() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.bytes
}
