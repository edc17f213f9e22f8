package scheduler

import (
	"encoding/json"
	"sync"

	"inferd/scheduler/backend"
	"inferd/store"
)

// inbox carries events from the scheduler's goroutines, timers and store
// callbacks to the loop. Posting never blocks: the store's writer calls back
// into it and must not wait on the loop, and goroutines that outlive the loop
// (a launch in flight at shutdown) must be able to finish. It holds at most
// one event per outstanding operation, so it stays small without a bound.
type inbox struct {
	mu     sync.Mutex
	evs    []event
	closed bool
	kick   chan struct{} // capacity 1: "there is something to take"
}

func newInbox() *inbox { return &inbox{kick: make(chan struct{}, 1)} }

// post queues ev for the loop. It reports false once the loop has stopped
// taking events; the poster then cleans up after itself.
func (b *inbox) post(ev event) bool {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return false
	}
	b.evs = append(b.evs, ev)
	b.mu.Unlock()
	select {
	case b.kick <- struct{}{}:
	default:
	}
	return true
}

// take returns the queued events and keeps spare (emptied) as the next
// buffer, so that the loop and its posters swap two slices instead of
// allocating one per batch.
func (b *inbox) take(spare []event) []event {
	clear(spare)
	b.mu.Lock()
	evs := b.evs
	b.evs = spare[:0]
	b.mu.Unlock()
	return evs
}

// close stops the inbox and returns what was still queued.
func (b *inbox) close() []event {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	evs := b.evs
	b.evs = nil
	return evs
}

// event is anything the loop reacts to apart from direct requests.
type event interface{ isEvent() }

// evPersisted: the first write of a call (see Scheduler.persist) has committed
// (err nil) or failed; answer and reply are the start's.
type evPersisted struct {
	c      *call
	err    error
	answer store.Call
	reply  chan<- startResult
}

// evFinal: the final write of a call has committed or failed; woken says
// the commit has closed the call's done already (see finish).
type evFinal struct {
	c     *call
	err   error
	woken bool
	// answered: the call was answered before its write (durability:
	// answered), which may have failed since.
	answered bool
}

// evLaunched: Backend.Launch returned.
// evPhase: a launching replica's backend says what it is doing that may
// take long (backend.PhaseBuildingEnvironment), or "" once that is over.
type evPhase struct {
	r     *rep
	phase string
}

type evLaunched struct {
	r    *rep
	inst backend.Instance
	err  error
}

// evReady: the replica's health check answered.
type evReady struct{ r *rep }

// evExited: the replica's process has exited. lastLine and exitErr are read
// by the watcher after the exit, off the loop.
type evExited struct {
	r        *rep
	exitErr  error
	lastLine string
	problem  backend.BootProblem // the backend's last finding while it booted
}

// evInferDone: an Infer call returned, or was never made (notSent) because
// the process had exited by then. end is the failure when err is not nil,
// decided off the loop because it looks at the process.
type evInferDone struct {
	c        *call
	r        *rep
	out      json.RawMessage
	err      error
	end      ending
	notSent  bool
	crashed  bool           // the process had exited when Infer failed: a model crash
	streamed bool           // the model streamed its reply: out is the array of its lines
	tokens   *store.Tokens  // what an OpenAI-compatible model reported it used
	measured *backend.Usage // what the backend measured over the Infer; nil when it cannot
}

// Timer events carry the seq their timer was armed with (see timer.fired).
type (
	evBootTimeout struct {
		r   *rep
		seq uint64
	}
	evIdleExpired struct {
		r   *rep
		seq uint64
	}
	evInferTimeout struct {
		c   *call
		seq uint64
	}
	evQueueExpired struct {
		c   *call
		seq uint64
	}
	evAbortGrace struct {
		r   *rep
		seq uint64
	}
	evBackoffDone struct {
		p   *project
		seq uint64
	}
	evGPUPoll struct{ seq uint64 }
)

// evProjectChanged: ProjectChanged was called.
type evProjectChanged struct{ id string }

// evProjectLoaded: the re-read that a change asked for has returned.
type evProjectLoaded struct {
	id  string
	p   store.Project
	err error
}

// evResaveFailed: writing a failure again (resaveFailures) failed again.
type evResaveFailed struct{ c store.Call }

func (evResaveFailed) isEvent()   {}
func (evPersisted) isEvent()      {}
func (evFinal) isEvent()          {}
func (evLaunched) isEvent()       {}
func (evPhase) isEvent()          {}
func (evReady) isEvent()          {}
func (evExited) isEvent()         {}
func (evInferDone) isEvent()      {}
func (evBootTimeout) isEvent()    {}
func (evIdleExpired) isEvent()    {}
func (evInferTimeout) isEvent()   {}
func (evBackoffDone) isEvent()    {}
func (evQueueExpired) isEvent()   {}
func (evAbortGrace) isEvent()     {}
func (evGPUPoll) isEvent()        {}
func (evProjectChanged) isEvent() {}
func (evProjectLoaded) isEvent()  {}
