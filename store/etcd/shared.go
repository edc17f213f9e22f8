package etcd

import (
	"context"
	"sync"

	clientv3 "go.etcd.io/etcd/client/v3"
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
// first caller of a round issues it, under its own context.
type sharedReads struct {
	mu   sync.Mutex
	keys map[string]*keyReads
}

type keyReads struct {
	inflight *readRound // issued; its callers all asked before it began
	next     *readRound // starts when inflight ends; callers arriving now join it
}

// readRound is one shared read and its answer. done closes when the answer
// is in; start (nil for a round issued at once) when it may be issued.
type readRound struct {
	start, done chan struct{}
	resp        *clientv3.GetResponse
	err         error
}

// get returns the answer of a read of key begun after the call, made with
// read (ctx is the issuing caller's: a round's answer, error included, is
// its callers'). Answers are shared: callers must not change them.
func (s *sharedReads) get(ctx context.Context, key string, read func(ctx context.Context) (*clientv3.GetResponse, error)) (*clientv3.GetResponse, error) {
	s.mu.Lock()
	if s.keys == nil {
		s.keys = map[string]*keyReads{}
	}
	k := s.keys[key]
	if k == nil {
		k = &keyReads{}
		s.keys[key] = k
	}
	var r *readRound
	issue := true
	switch {
	case k.inflight == nil:
		r = &readRound{done: make(chan struct{})}
		k.inflight = r
	case k.next == nil:
		r = &readRound{start: make(chan struct{}), done: make(chan struct{})}
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
			return nil, ctx.Err()
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
