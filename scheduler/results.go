package scheduler

import (
	"runtime"
	"sync"
	"time"
	"unsafe"
	"weak"

	"inferd/store"
)

// shareMinBytes is the smallest result whose copy concurrent lookups share:
// below it a read is cheaper than the bookkeeping.
const shareMinBytes = 64 << 10

// shareFor is how long after its read a result's copy may serve another
// lookup. Short, so that a call deleted meanwhile (expired, purged) stops
// being answered at once in all but a race any earlier check could have
// won; long enough that clients polling one call together share one copy.
const shareFor = time.Second

// sharedResults lets lookups of one finished call share one copy of its
// outputs: 32 clients checking a 5 MB result hold one 5 MB buffer, not 32,
// and copy it once. Lookups that arrive while the store read is under way
// wait for it; later ones take the copy while it is still in use by some
// request (a weak pointer: the map never keeps a result alive) and younger
// than shareFor. A result is final, so a shared copy is never stale; the
// buffer is read-only to everyone who holds it.
type sharedResults struct {
	mu      sync.Mutex
	reading map[string]*resultRead
	held    map[string]heldResult
}

// resultRead is a store read in flight; its waiters read c and err once
// done is closed.
type resultRead struct {
	done chan struct{}
	c    store.Call
	err  error
}

// heldResult is a finished call read recently: its record, and its outputs
// while some request still holds them.
type heldResult struct {
	c    store.Call // without Outputs
	out  weak.Pointer[byte]
	n    int
	read time.Time
}

func newSharedResults() *sharedResults {
	return &sharedResults{reading: map[string]*resultRead{}, held: map[string]heldResult{}}
}

// get returns call id as read(id) returns it, sharing the outputs' copy
// with other lookups of the same finished call (see sharedResults).
func (r *sharedResults) get(id string, now time.Time, read func(string) (store.Call, error)) (store.Call, error) {
	r.mu.Lock()
	if h, ok := r.held[id]; ok {
		if p := h.out.Value(); p != nil && now.Sub(h.read) < shareFor {
			c := h.c
			c.Outputs = unsafe.Slice(p, h.n)
			r.mu.Unlock()
			return c, nil
		}
		delete(r.held, id)
	}
	if f, ok := r.reading[id]; ok {
		r.mu.Unlock()
		<-f.done
		return f.c, f.err
	}
	f := &resultRead{done: make(chan struct{})}
	r.reading[id] = f
	r.mu.Unlock()

	f.c, f.err = read(id)

	r.mu.Lock()
	delete(r.reading, id)
	if f.err == nil && f.c.State.Done() && len(f.c.Outputs) >= shareMinBytes {
		meta := f.c
		meta.Outputs = nil
		first := &f.c.Outputs[0]
		r.held[id] = heldResult{c: meta, out: weak.Make(first), n: len(f.c.Outputs), read: now}
		// Forget the entry once nobody holds the outputs, so that the map
		// does not grow with every large result ever checked.
		runtime.AddCleanup(first, r.forget, id)
	}
	r.mu.Unlock()
	close(f.done)
	return f.c, f.err
}

// forget drops id's entry if its outputs are gone (a newer read may have
// replaced it).
func (r *sharedResults) forget(id string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if h, ok := r.held[id]; ok && h.out.Value() == nil {
		delete(r.held, id)
	}
}
