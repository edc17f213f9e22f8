package etcd

import (
	"context"
	"sync"
)

// sharedReads lets concurrent reads of one key share one request, without
// serving anyone an answer older than its own call: a caller joins the
// next read of the key that starts after it asked (while one is in flight,
// the read queued behind it), never the one already under way. Every answer
// is therefore a linearizable read begun after the caller's call, as its
// own would have been, so a revocation or a project write committed before
// a call is seen by it, through any node. Under load the hot keys of a
// start (its API key, its modelKey's index entry, its project) cost one
// request per round instead of one per call.
//
// At most one read of a key is in flight and one waits behind it; the
// first caller of a round issues it, under its own context. R is the
// read's answer: a Get's, or a transaction's of several reads (a start's
// key and project: LookupStart), shared by whoever names the same keys.
type sharedReads[R any] struct {
	mu   sync.Mutex
	keys map[string]*keyReads[R]
}

type keyReads[R any] struct {
	inflight *readRound[R] // issued; its callers all asked before it began
	next     *readRound[R] // starts when inflight ends; callers arriving now join it
}

// readRound is one shared read and its answer. done closes when the answer
// is in; start (nil for a round issued at once) when it may be issued.
type readRound[R any] struct {
	start, done chan struct{}
	resp        R
	err         error
}

// get returns the answer of a read of key begun after the call, made with
// read (ctx is the issuing caller's: a round's answer, error included, is
// its callers'). Answers are shared: callers must not change them.
func (s *sharedReads[R]) get(ctx context.Context, key string, read func(ctx context.Context) (R, error)) (R, error) {
	s.mu.Lock()
	if s.keys == nil {
		s.keys = map[string]*keyReads[R]{}
	}
	k := s.keys[key]
	if k == nil {
		k = &keyReads[R]{}
		s.keys[key] = k
	}
	var r *readRound[R]
	issue := true
	switch {
	case k.inflight == nil:
		r = &readRound[R]{done: make(chan struct{})}
		k.inflight = r
	case k.next == nil:
		r = &readRound[R]{start: make(chan struct{}), done: make(chan struct{})}
		k.next = r
	default:
		r, issue = k.next, false
	}
	s.mu.Unlock()
	if !issue {
		select {
		case <-r.done:
			return r.resp, r.err
		case <-ctx.Done():
			var zero R
			return zero, ctx.Err()
		}
	}
	if r.start != nil {
		<-r.start // the read in flight ends within its own bound
	}
	r.resp, r.err = read(ctx)
	s.mu.Lock()
	close(r.done)
	k.inflight, k.next = k.next, nil
	if k.inflight == nil {
		delete(s.keys, key)
	} else {
		close(k.inflight.start)
	}
	s.mu.Unlock()
	return r.resp, r.err
}
