package scheduler

import (
	"context"
	"errors"

	"inferd/store"
)

// ErrShuttingDown is Submit's and SubmitWait's error once Drain has begun.
// Its text is the client message without "error: ".
var ErrShuttingDown = errors.New("server is shutting down; retry shortly")

// Drain readies the scheduler for a shutdown. From now on Submit and
// SubmitWait refuse new calls with ErrShuttingDown, Ready reports false, and
// nothing is dispatched or booted: queued calls stay queued, in the store,
// for the next start. Calls already running go on; Drain returns once none
// is left running and every result is durable and its waiters woken, or once
// ctx ends (the daemon's shutdownTimeout). Then the calls still running end
// as interrupted (msgInterrupted, what a restart would say of them) and
// Drain returns their number once those results are durable too.
//
// Cancel Run's context afterwards to stop the replicas. Drain is meant to be
// called once; it returns at once if Run has returned or never recovers.
func (s *Scheduler) Drain(ctx context.Context) (interrupted int) {
	s.draining.Store(true)
	idle := make(chan struct{})
	if !s.in.post(evDrain{idle: idle}) {
		return 0 // Run has returned
	}
	select {
	case <-idle:
		return 0
	case <-s.stopped:
		return 0
	case <-ctx.Done():
	}
	reply := make(chan int, 1)
	if !s.in.post(evDrainDeadline{reply: reply}) {
		return 0
	}
	select {
	case interrupted = <-reply:
	case <-s.stopped:
		return 0
	}
	select {
	case <-idle: // their final writes
	case <-s.stopped:
	}
	return interrupted
}

// evDrain: Drain has begun; idle is to be closed once no call runs.
type evDrain struct{ idle chan struct{} }

// evDrainDeadline: Drain's context ended with calls still running.
type evDrainDeadline struct{ reply chan int }

func (evDrain) isEvent()         {}
func (evDrainDeadline) isEvent() {}

// drainState is the loop's state once Drain has begun.
type drainState struct {
	idle   chan struct{}
	closed bool // idle is closed
}

func (s *Scheduler) onDrain(ev evDrain) {
	if s.drain == nil {
		s.drain = &drainState{idle: ev.idle}
	}
}

// onDrainDeadline ends every running call as interrupted and answers how
// many there were. A call its project's retries allow to run again goes back
// to the queue instead (stored queued, it runs after the restart) and is not
// counted.
func (s *Scheduler) onDrainDeadline(reply chan int) {
	n := 0
	for _, c := range s.calls {
		if c.r != nil && !c.finished() {
			s.detach(c)
			if s.retry(c) {
				continue
			}
			s.finish(c, nil, failed(store.FailInterrupted, msgInterrupted))
			n++
		}
	}
	reply <- n
}

// drainPass replaces the scheduling pass while draining: nothing is
// dispatched, booted or timed out, and Drain hears once no call is running
// or waiting for its final write. Queued calls do not count: they stay.
func (s *Scheduler) drainPass() {
	if s.drain.closed {
		return
	}
	for _, c := range s.calls {
		if c.r != nil || c.finished() {
			return
		}
	}
	s.drain.closed = true
	close(s.drain.idle)
}
