package scheduler

import (
	"sync"
	"time"
)

// FinalFeed tells of calls made final anywhere in a cluster: store/etcd's
// OnCallFinal, whose hooks run on the store's watch goroutine for every
// call whose final write committed, through any node.
type FinalFeed interface {
	OnCallFinal(fn func(id string))
}

// finalWaitsKept bounds how long a wait for a call that never becomes final
// (its record deleted by hand, say) is kept: longer than any call may run
// (inferenceTimeout is at most a day), so that no waiter still listening is
// dropped, and short enough that such waits do not pile up.
const finalWaitsKept = 25 * time.Hour

// finalWaiters is the completion signal of the calls Lookup finds
// unfinished in the store and unknown to the loop: in cluster mode, calls
// running on another node. One channel per call, shared by every waiter,
// closed when the FinalFeed tells of the call. It has its own lock, not the
// loop: the feed's hook runs on the store's goroutine and must be quick.
type finalWaiters struct {
	mu     sync.Mutex
	waits  map[string]finalWait
	pruned time.Time // when waits older than finalWaitsKept were last dropped
}

type finalWait struct {
	done  chan struct{}
	since time.Time
}

func newFinalWaiters() *finalWaiters {
	return &finalWaiters{waits: map[string]finalWait{}}
}

// wait returns the channel closed once call id is told final.
func (f *finalWaiters) wait(id string, now time.Time) <-chan struct{} {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now.Sub(f.pruned) > time.Hour {
		f.pruned = now
		for k, w := range f.waits {
			if now.Sub(w.since) > finalWaitsKept {
				delete(f.waits, k) // its waiters end at their own wait
			}
		}
	}
	w, ok := f.waits[id]
	if !ok {
		w = finalWait{done: make(chan struct{}), since: now}
		f.waits[id] = w
	}
	return w.done
}

// final wakes the waiters of call id; a call nobody waits for is ignored.
// It is the FinalFeed's hook.
func (f *finalWaiters) final(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if w, ok := f.waits[id]; ok {
		close(w.done)
		delete(f.waits, id)
	}
}
