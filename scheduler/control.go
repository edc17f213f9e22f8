package scheduler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"inferd/store"
)

// Call control: cancel, queue purge, queue deadlines and retries. Each ends
// or moves a live call on the loop through the same lifecycle as everything
// else (lifecycle.go): a cancelled or expired call goes queued/saving/running
// → finishing with a failed outcome, a retried one running → queued.

// The texts of calls ended by call control.
const (
	msgCancelled   = "error: cancelled by request"
	msgQueuePurged = "error: cancelled: queue purged"
	// msgDisconnected: the client that held the call's answer open (an
	// OpenAI stream) went away, or read too slowly, and nobody else can
	// read the rest as it comes.
	msgDisconnected = "error: cancelled: the client disconnected"
)

func msgExpired(secs int) string {
	return fmt.Sprintf("error: expired after %ds in the queue", secs)
}

// ErrFinished is wrapped by Cancel's error when the call had already
// finished. The error's text is the client message without "error: ".
var ErrFinished = errors.New("call already finished")

// finishedError says how the call finished, as a check of it says it:
// "call already finished (succeeded)", "call already finished (failed:
// cancelled by request)".
type finishedError struct{ c store.Call }

func (e *finishedError) Error() string {
	why := strings.TrimPrefix(e.c.Message, "error: ")
	if e.c.State != store.CallFailed || why == "" {
		return fmt.Sprintf("%s (%s)", ErrFinished, e.c.State)
	}
	return fmt.Sprintf("%s (%s: %s)", ErrFinished, e.c.State, why)
}

func (e *finishedError) Unwrap() error { return ErrFinished }

// FinishedError is the error Cancel returns for finished call c, for
// callers that cancel calls no scheduler runs (CancelStored).
func FinishedError(c store.Call) error { return &finishedError{c: c} }

// Cancelled returns pending call c as a cancel at now leaves it, for a store
// no scheduler serves: the next one to start recovers it as finished.
func Cancelled(c store.Call, now time.Time) store.Call {
	c.State, c.Message, c.Finished, c.Outputs = store.CallFailed, msgCancelled, now, nil
	c.Failure = &store.Failure{Kind: store.FailCancelled}
	return c
}

// control runs fn on the loop and returns once it has run, or reports false
// when the loop is not running.
func (s *Scheduler) control(fn func()) bool {
	ran := make(chan struct{})
	select {
	case s.controlc <- func() { fn(); close(ran) }:
		<-ran // the loop runs it at once, before anything else
		return true
	case <-s.stopped:
		return false
	}
}

// Cancel ends call id: a queued call is taken out of its queue and never
// reaches a model; a running call's request to the model is aborted (its
// replica is replaced if it is not free again within Config.AbortGrace).
// Cancel returns the call once its cancellation is durable, so every later
// Lookup, here or after a restart, answers "error: cancelled by request",
// and every waiter has been woken. A call that had already finished is an
// error wrapping ErrFinished; an unknown one store.ErrNotFound; one this
// node dropped unfinished meanwhile (cluster mode: handed to another node)
// store.ErrUnavailable, as the cancel did not take effect.
func (s *Scheduler) Cancel(id string) (store.Call, error) {
	return s.cancel(id, failed(store.FailCancelled, msgCancelled))
}

// Disconnected ends call id as Cancel does, for a client that went away
// while it alone held the call's answer open (an OpenAI stream): the call
// reads "error: cancelled: the client disconnected", kind
// store.FailDisconnected, not a cancel by request, which nobody asked for.
func (s *Scheduler) Disconnected(id string) (store.Call, error) {
	return s.cancel(id, failed(store.FailDisconnected, msgDisconnected))
}

// cancel ends call id as e says (Cancel, Disconnected).
func (s *Scheduler) cancel(id string, e ending) (store.Call, error) {
	var (
		c      *call
		cancel bool // this Cancel ended it
	)
	ok := s.control(func() {
		c = s.calls[id]
		if c != nil && !c.finished() {
			cancel = true
			s.abort(c, e)
			s.cfg.Observer.CallCancelled(c.p.id)
		}
	})
	if !ok {
		return store.Call{}, errStopped
	}
	if c == nil {
		// Not live: finished (or unknown), and the store says which.
		got, _, err := s.Lookup(id)
		if err != nil {
			return store.Call{}, err
		}
		if !got.State.Done() {
			return store.Call{}, fmt.Errorf("cancel call %s: %w", id, errStopped)
		}
		return got, &finishedError{c: got}
	}
	<-c.done
	if !c.result.State.Done() {
		// Dropped here unfinished: this node's lease lapsed, or the call's
		// final write (the cancel's, or the result's it raced) was refused
		// because the call was handed to another node. Neither a cancel
		// nor a finish took effect here: that node answers for the call
		// now, and the client's retry reaches it.
		return store.Call{}, fmt.Errorf("cancel call %s: it was handed to another node: %w", id, store.ErrUnavailable)
	}
	if !cancel {
		return c.result, &finishedError{c: c.result} // it finished first
	}
	return c.result, nil
}

// Purge cancels every call waiting in project id's queue, as a cancel
// would ("error: cancelled: queue purged"), and returns how many it ended,
// once their cancellation is durable. Running calls run on.
func (s *Scheduler) Purge(id string) (int, error) {
	var purged []*call
	ok := s.control(func() {
		p := s.projects[id]
		if p == nil {
			return
		}
		purged = p.queue.drain()
		for _, c := range purged {
			s.finish(c, nil, failed(store.FailCancelled, msgQueuePurged))
			s.cfg.Observer.CallCancelled(p.id)
		}
	})
	if !ok {
		return 0, errStopped
	}
	for _, c := range purged {
		<-c.done
	}
	return len(purged), nil
}

// abort ends live call c as e says wherever it is. A running call's Infer is
// cancelled, but its replica stays taken by it until Infer has returned
// (aborted), or is stopped if that takes longer than AbortGrace.
func (s *Scheduler) abort(c *call, e ending) {
	switch c.state {
	case callQueued, callSaving:
		c.p.queue.remove(c)
	case callRunning:
		s.abortRun(c)
	}
	s.finish(c, nil, e)
}

// abortRun detaches running call c and cancels its Infer; its replica
// stays taken by it until Infer has returned (aborted), or is stopped if
// that takes longer than AbortGrace.
func (s *Scheduler) abortRun(c *call) {
	if c.b != nil {
		s.abortBatchCall(c)
		return
	}
	r := c.r
	s.detach(c)
	c.abortedOn = r
	s.abortStarted(r)
}

// abortStarted: a request on r was aborted; r stays taken by it until it
// returns (abortEnded), and is stopped if that takes longer than
// AbortGrace.
func (s *Scheduler) abortStarted(r *rep) {
	r.aborting++
	if !r.abortT.armed() {
		s.arm(&r.abortT, s.cfg.AbortGrace, func(seq uint64) event { return evAbortGrace{r: r, seq: seq} })
	}
}

// aborted: the Infer of cancelled call c has returned, so its replica has
// room again.
func (s *Scheduler) aborted(c *call) {
	r := c.abortedOn
	c.abortedOn = nil
	s.abortEnded(r)
}

// abortEnded: an aborted request on r has returned (see abortStarted).
func (s *Scheduler) abortEnded(r *rep) {
	r.aborting--
	if r.aborting == 0 {
		r.abortT.stop()
		if len(r.calls) == 0 {
			r.idleSince = s.clk.Now()
		}
	}
}

// onAbortGrace stops a replica whose aborted requests have not returned in
// time: the model may be stuck in them. The scheduling pass replaces it if
// it is still needed.
func (s *Scheduler) onAbortGrace(r *rep, seq uint64) {
	if !r.abortT.fired(seq) || r.aborting == 0 || r.state == stateStopping {
		return
	}
	s.log.Warn().Str("project", r.p.id).Str("replica", r.id).Stringer("grace", s.cfg.AbortGrace).
		Msg("a cancelled call's request did not end in time; stopping the replica")
	for _, c := range r.callList() {
		s.detach(c)
		if !s.retry(c) {
			s.finish(c, nil, failed(store.FailModel, msgExited(errors.New("stopped: a cancelled call on it did not end"))))
		}
	}
	s.stop(r)
}

// armExpiry starts queued call c's queueTimeout, counted from its creation
// (a recovered call may be past it already: it then expires at once).
func (s *Scheduler) armExpiry(c *call) {
	if c.c.QueueTimeout <= 0 {
		return
	}
	d := c.c.Created.Add(seconds(c.c.QueueTimeout)).Sub(s.clk.Now())
	s.arm(&c.expiry, max(d, 0), func(seq uint64) event { return evQueueExpired{c: c, seq: seq} })
}

// onQueueExpired ends a call still waiting when its queueTimeout passes: it
// never runs.
func (s *Scheduler) onQueueExpired(c *call, seq uint64) {
	if !c.expiry.fired(seq) || (c.state != callQueued && c.state != callSaving) {
		return
	}
	if c.p.batchT.armed() {
		// Held back only by its batch's wait, which ends at a call's
		// queueTimeout: it goes now, with its batch.
		s.dispatch(c.p)
		if c.state != callQueued && c.state != callSaving {
			return
		}
	}
	c.p.queue.remove(c)
	s.finish(c, nil, failed(store.FailExpired, msgExpired(c.c.QueueTimeout)))
	s.cfg.Observer.CallExpired(c.p.id)
}

// retry puts c, whose run a model crash, a replica stopped under it or a
// shutdown interrupted, back in front of its queue under the same ID when its
// project allows another attempt, and reports whether it did. The attempt
// just made stays counted. The caller has detached c.
func (s *Scheduler) retry(c *call) bool {
	if c.p.deleted || !c.p.mayRetry(c.c.Attempt) {
		return false
	}
	s.move(c, callQueued)
	c.c.State = store.CallQueued
	c.c.ReplicaID = ""
	c.c.Dispatched = time.Time{}
	c.c.QueueMs, c.c.BootMs = 0, 0
	c.c.BatchSize, c.c.BatchWaitMs = 0, 0
	c.p.queue.pushFront(c)
	s.cfg.Observer.CallRetried(c.p.id)
	s.log.Info().Str("project", c.p.id).Str("call", c.c.ID).Int("attempt", c.c.Attempt).
		Msg("call interrupted; running it again")
	if !c.unsaved {
		s.st.SaveCallAsync(c.c, s.logSaveErr(c, "saving a retried call failed"))
	}
	return true
}

// mayRetry reports whether a call interrupted in its attempt-th run may run
// again: the project allows retries and the runs so far are at most that
// many (the first run is not a retry).
func (p *project) mayRetry(attempt int) bool {
	return p.cfg.Retries > 0 && attempt <= p.cfg.Retries
}

// index makes live call c findable by its idempotency key.
func (s *Scheduler) index(c *call) {
	if c.c.IdempotencyKey != "" {
		s.idem[string(store.IdempotencyIndexKey(c.c.TeamID, c.c.IdempotencyKey))] = c
	}
}

// unindex forgets c's idempotency key once the store answers for it.
func (s *Scheduler) unindex(c *call) {
	if c.c.IdempotencyKey == "" {
		return
	}
	k := string(store.IdempotencyIndexKey(c.c.TeamID, c.c.IdempotencyKey))
	if s.idem[k] == c {
		delete(s.idem, k)
	}
}

// Warmup boots project cfg's replicas up to max(minReplicas, 1) and returns
// once one is ready (at once if one is), with the boot's failure ("model
// failed to start: ..."), or with ctx's error. A warmed replica then
// follows the project's idleTimeout like any other. cfg is the caller's
// copy, taken as admit takes it for a project the loop has not loaded yet.
func (s *Scheduler) Warmup(ctx context.Context, cfg store.Project) error {
	ready := make(chan error, 1)
	ok := s.control(func() {
		p := s.projects[cfg.ID]
		if p == nil || p.deleted {
			p = s.addProject(cfg)
			s.reload(p.id) // to be sure it still exists
		}
		switch {
		case p.pick() != nil || slices.ContainsFunc(p.replicas, func(r *rep) bool { return r.live() && r.state == stateReady }):
			ready <- nil
		default:
			p.warmers = append(p.warmers, ready)
		}
	})
	if !ok {
		return errStopped
	}
	select {
	case err := <-ready:
		return err
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stopped:
		return errStopped
	}
}

// warmed answers p's Warmup waiters: a replica is ready (err nil) or a boot
// failed.
func (p *project) warmed(err error) {
	for _, w := range p.warmers {
		w <- err // buffered, one answer each
	}
	p.warmers = nil
}
