package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// maxRecentFailures bounds the calls kept in memory whose final write
// failed; the oldest are forgotten first.
const maxRecentFailures = 10000

// dispatch hands the project's next calls (highest priority, then oldest:
// see queue) to its ready replicas with room: a call per request, or for a
// project that batches, a batch per request (batch.go), which may wait
// for more calls.
func (s *Scheduler) dispatch(p *project) {
	if p.queue.len() == 0 {
		s.endBatchWait(p) // the common case after every event: nothing to read the clock for
		return
	}
	now := s.clk.Now()
	for {
		c := p.queue.peek(now)
		if c == nil || c.state != callQueued {
			break // a later call never overtakes one whose first write is in flight
		}
		r := p.pick()
		if r == nil {
			break
		}
		if why := s.runBlocked(p); why != "" {
			p.quotaWait = why
			break
		}
		if p.batching() && c.c.Route == "" { // a route is the model's own path: never batched
			if !s.dispatchBatch(p, r, now) {
				return // the batch waits to fill
			}
			continue
		}
		p.queue.pop(c)
		s.startCall(c, r)
	}
	s.endBatchWait(p)
}

// startCall marks c running on r, alone, and starts its Infer goroutine.
func (s *Scheduler) startCall(c *call, r *rep) {
	ctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	s.attach(c, r, 0, 0)
	// Inputs nil: the call is durable and they are read from the store
	// by the Infer goroutine, off the loop (see infer).
	s.runInfer(inferJob{ctx: ctx, c: c, id: c.c.ID, r: r, inst: r.inst, inputs: c.c.Inputs})
}

// attach marks c running on r, in a batch of batchSize calls that waited
// batchWaitMs to fill (0, 0: alone), queues that write and starts the
// inference timeout. The caller runs the request.
func (s *Scheduler) attach(c *call, r *rep, batchSize int, batchWaitMs int64) {
	s.move(c, callRunning)
	c.expiry.stop() // dispatched in time
	now := s.clk.Now()
	c.c.State = store.CallRunning
	c.c.Dispatched = now
	c.c.ReplicaID = r.id
	c.c.Attempt++
	c.c.QueueMs = ms(now.Sub(c.c.Created))
	c.c.BootMs = 0
	c.c.BatchSize, c.c.BatchWaitMs = batchSize, batchWaitMs
	if r.readyAt.After(c.c.Created) {
		// The call waited for this replica to boot: from whichever came later,
		// the call or the boot, until ready.
		from := r.started
		if c.c.Created.After(from) {
			from = c.c.Created
		}
		c.c.BootMs = ms(r.readyAt.Sub(from))
	}
	s.account(r, now) // its idle time, or its other calls' shares, up to now
	c.shareFrom = r.callShare
	c.r = r
	c.gpus, c.gpuWeight = len(r.gpus), r.gpuWeight
	r.calls[c] = struct{}{}
	r.idleSince = now
	r.idleT.stop()
	c.p.running++

	secs := c.p.inferenceTimeout()
	if c.c.Timeout > 0 && c.c.Timeout < secs {
		secs = c.c.Timeout // a call may only shorten its project's timeout
	}
	c.timeoutSecs = secs
	s.arm(&c.timeout, seconds(secs), func(seq uint64) event { return evInferTimeout{c: c, seq: seq} })
	if !c.unsaved {
		s.st.SaveCallAsync(c.c, s.logSaveErr(c, "saving a running call failed"))
	}
}

// infer runs one call on inst and reports the outcome. The failure message
// is decided here, off the loop, because it looks at the process.
func (s *Scheduler) infer(ctx context.Context, j inferJob) {
	if j.b != nil {
		s.inferBatch(ctx, j)
		return
	}
	c, r, inst, inputs := j.c, j.r, j.inst, j.inputs
	if isClosed(inst.Exited()) {
		// Dispatched just as the process died: the model never saw the call,
		// so it goes back to the queue rather than failing.
		s.in.post(evInferDone{c: c, r: r, notSent: true})
		return
	}
	if inputs == nil {
		// The one copy of the inputs in memory, held while the model
		// reads them and dropped when this returns.
		in, err := s.st.CallInputs(j.id)
		if err != nil {
			s.log.Error().Err(err).Str("call", j.id).Msg("reading a call's inputs failed")
			s.in.post(evInferDone{c: c, r: r, err: err, end: failed(store.FailInferd, msgInputsUnreadable)})
			return
		}
		inputs = in
	}
	cs := &callStream{id: c.c.ID, sink: s.cfg.Outputs}
	s.cfg.Outputs.CallRunning(cs.id)
	measured := measure(inst)
	out, err := inst.Infer(ctx, backend.Request{Inputs: inputs, Route: c.c.Route, Stream: cs, Meter: cs})
	ev := evInferDone{c: c, r: r, out: out, err: err, streamed: cs.began, tokens: cs.tokens, measured: measured()}
	if err != nil {
		exited := isClosed(inst.Exited())
		var exitErr error
		if exited {
			exitErr = inst.ExitErr()
		}
		ev.end = s.inferFailure(j.id, err, exited, exitErr)
		ev.crashed = exited
	}
	s.in.post(ev) // after shutdown nobody wants it: the call stays running in the store
}

func (s *Scheduler) onInferDone(ev evInferDone) {
	c := ev.c
	s.pass.touch(c.p) // whichever way it ends, only its project changes
	if c.abortedOn == ev.r {
		s.aborted(c)
		return
	}
	if c.r != ev.r || c.finished() {
		return // already ended by a timeout, an exit or a delete
	}
	s.detach(c)
	if ev.notSent {
		s.requeue(c)
		return
	}
	c.measured = ev.measured
	if !ev.crashed {
		c.p.est.ran(s.clk.Now().Sub(c.c.Dispatched)) // the model answered: a run to learn from
	}
	if ev.err != nil && ev.crashed && s.retry(c) {
		return
	}
	if ev.err != nil {
		s.finish(c, nil, ev.end)
		return
	}
	c.c.Streamed = ev.streamed
	c.c.Tokens = ev.tokens
	s.finish(c, ev.out, succeeded)
}

// requeue puts a call that never reached its replica back at the head of
// its queue, and says so in the store, so that a restart requeues it too.
func (s *Scheduler) requeue(c *call) {
	s.move(c, callQueued)
	c.c.State = store.CallQueued
	c.c.ReplicaID = ""
	c.c.Dispatched = time.Time{}
	c.c.QueueMs, c.c.BootMs = 0, 0
	c.c.BatchSize, c.c.BatchWaitMs = 0, 0
	c.c.Attempt--
	c.p.queue.pushFront(c)
	if !c.unsaved {
		s.st.SaveCallAsync(c.c, s.logSaveErr(c, "saving a requeued call failed"))
	}
}

// logSaveErr returns a done callback for writes whose failure only matters
// to the operator: the next write of the same call supersedes them. A write
// refused because the call was handed to another node (store.ErrFenced, in
// cluster mode) makes the loop forget the call (onFenced).
func (s *Scheduler) logSaveErr(c *call, msg string) func(error) {
	id := c.c.ID
	return func(err error) {
		switch {
		case errors.Is(err, store.ErrFenced):
			s.in.post(evFenced{c: c}) // after shutdown: nothing to forget
		case err != nil:
			s.log.Error().Err(err).Str("call", id).Msg(msg)
		}
	}
}

// onInferTimeout fails the call and stops its replica, which may be wedged;
// the scheduling pass replaces it if it is still needed.
func (s *Scheduler) onInferTimeout(c *call, seq uint64) {
	if !c.timeout.fired(seq) || c.r == nil || c.finished() {
		return
	}
	r, b := c.r, c.b
	secs := c.timeoutSecs
	end := batchOf(c, failed(store.FailTimeout, msgInferenceTimeout(secs)))
	s.detach(c)
	s.finish(c, nil, end)
	// The replica's other calls end with it; say why, or they would read
	// as a model crash. Those of the same batch timed out with it.
	for other := range r.calls {
		why := failed(store.FailTimeout, msgStoppedForTimeout(secs))
		if b != nil && other.b == b {
			why = end
		}
		s.detach(other)
		s.finish(other, nil, why)
	}
	s.log.Warn().Str("project", c.p.id).Str("replica", r.id).Str("call", c.c.ID).
		Int("timeoutSeconds", secs).Msg("inference timed out; stopping the replica")
	s.stop(r)
}

// detach ends c's run on its replica: the replica gets the room back and the
// Infer goroutine is cancelled.
func (s *Scheduler) detach(c *call) {
	r := c.r
	s.account(r, s.clk.Now()) // c's share up to now
	c.replicaSeconds += r.callShare - c.shareFrom
	delete(r.calls, c)
	if len(r.calls) == 0 {
		r.idleSince = s.clk.Now()
	}
	c.p.running--
	c.timeout.stop()
	if c.b != nil {
		leaveBatch(c) // its batch's request goes on for the others
	} else {
		c.cancel()
	}
	c.r = nil
}

// finish decides c's outcome, e (succeeded, or how it failed), and queues
// its final write; waiters wake once it has committed (onFinal). The caller
// has taken c off its queue or replica.
func (s *Scheduler) finish(c *call, out json.RawMessage, e ending) {
	if !s.move(c, callFinishing) {
		return
	}
	c.expiry.stop()
	now := s.clk.Now()
	f := c.c
	f.State, f.Outputs, f.Message, f.Failure, f.Finished = store.CallSucceeded, out, e.msg, e.fail, now
	if e.fail != nil {
		f.State = store.CallFailed
	}
	if !f.Dispatched.IsZero() {
		f.RunMs = ms(now.Sub(f.Dispatched))
	}
	f.Usage = callUsage(c, f.RunMs, out)
	// Until the write commits only the loop reads result; after the loop is
	// gone, the waiters woken below read it as the outcome.
	c.result = f
	done := c.done
	// A sync start that has waited all along (unsaved: its ID is nobody
	// else's to know) is woken by the commit itself, not a hop later by
	// the loop: its answer is c.result, which nothing changes once the
	// write has committed (see onFinal and lookupLive).
	early := c.unsaved
	if early && c.p.cfg.AnswersFirst() {
		// durability: answered: the waiter has the result now, and the
		// record follows in the next group commit. A crash before that
		// commit loses a call whose answer went out (docs/reliability.md);
		// a failed write keeps it in memory and writes it again (onFinal).
		close(done) // answered: c.result is final from here on
		s.st.SaveCallAsync(f, func(err error) {
			s.in.post(evFinal{c: c, err: err, woken: true, answered: true})
		})
		return
	}
	s.st.SaveCallAsync(f, func(err error) {
		woken := early && err == nil
		if woken {
			close(done)
		}
		if !s.in.post(evFinal{c: c, err: err, woken: woken}) && !woken {
			close(done) // the loop is gone; the store has the last word
		}
	})
}

// onFinal wakes the call's waiters now that its result is durable. A failed
// write still wakes them, with the call failed for that reason and kept in
// memory, since the store cannot answer for it, and written again once a
// later write lands. A sync start's call that was never stored gets no ID:
// see finalAnswer.
func (s *Scheduler) onFinal(c *call, err error, woken, answered bool) {
	if s.calls[c.c.ID] == c {
		delete(s.calls, c.c.ID)
	}
	// Only now: until the final write has committed, a repeated start
	// must find the call here, since the store may not have it yet.
	s.unindex(c)
	f := c.result
	switch {
	case err != nil && answered && errors.Is(err, store.ErrFenced):
		// Answered, and another node holds the call now: it is lost here
		// as in a crash of this node (its waiter has read c.result).
		s.log.Warn().Err(err).Str("call", c.c.ID).Str("project", c.p.id).Msg(msgDiscarded)
	case err != nil && answered:
		// Its waiter has its result: keep that, in memory, until a later
		// write lands and this one is written again.
		s.log.Error().Err(err).Str("call", c.c.ID).Msg("saving an answered call's result failed; kept in memory, written again once the store takes writes")
		s.failures.add(f)
		s.resave.add(f)
	case errors.Is(err, store.ErrFenced):
		s.discarded(c, err)
		return
	case err != nil:
		s.log.Error().Err(err).Str("call", c.c.ID).Msg("saving a call result failed")
		f.State, f.Outputs, f.Message = store.CallFailed, nil, msgStorageFull
		f.Failure = &store.Failure{Kind: store.FailInferd}
		if errors.Is(err, store.ErrUnavailable) {
			f.Message = msgResultUnavailable
		}
		if c.unsaved {
			// Never stored, and its ID never given out: the start answers
			// with the error instead, so no ID exists that a restart forgets.
			c.unstored = true
			break
		}
		s.failures.add(f)
		s.resave.add(f)
	case s.resave.len() > 0:
		s.resaveFailures() // this write landed: the store takes writes again
	}
	if f.State == store.CallSucceeded {
		s.move(c, callSucceeded)
	} else {
		s.move(c, callFailed)
	}
	s.cfg.Observer.CallFinished(f)
	if woken {
		return // by the commit (see finish): c.result was f already
	}
	c.result = f
	close(c.done)
}

// resaveFailures writes again the failures whose final write failed, so
// that the store answers for them as their waiters were told, after a restart
// too, rather than keep them running (which a restart reads as interrupted).
// One that fails again is kept for the next try.
func (s *Scheduler) resaveFailures() {
	for _, f := range s.resave.take() {
		s.st.SaveCallAsync(f, func(err error) {
			switch {
			case errors.Is(err, store.ErrFenced):
				s.log.Warn().Str("call", f.ID).Msg(msgDiscarded)
			case err != nil:
				s.in.post(evResaveFailed{c: f})
			}
		})
	}
}

// msgMoveRefused is logged when the loop tries a move the lifecycle refuses.
const msgMoveRefused = "scheduler: call state move refused"

// move takes c to next. The lifecycle refuses a move it does not allow; that
// is a bug in the loop, logged, and the call stays where it was.
func (s *Scheduler) move(c *call, next callState) bool {
	if err := c.to(next); err != nil {
		s.log.Error().Err(err).Msg(msgMoveRefused)
		return false
	}
	return true
}

// failQueued fails every queued call of p as e says.
func (s *Scheduler) failQueued(p *project, e ending) {
	for _, c := range p.queue.drain() {
		s.finish(c, nil, e)
	}
}

// lookupLive answers Lookup for calls the loop knows.
func (s *Scheduler) lookupLive(id string) lookupResult {
	if c, ok := s.calls[id]; ok {
		if c.state == callFinishing && isClosed(c.done) {
			// Its final write has committed and woken its waiters (see
			// finish): the loop has not had the news yet, they have.
			return lookupResult{c: c.result, done: c.done, found: true}
		}
		return lookupResult{c: s.view(c), done: c.done, found: true}
	}
	if f, ok := s.failures.get(id); ok {
		return lookupResult{c: f, done: s.closedc, found: true, unsaved: true}
	}
	return lookupResult{}
}

// view is a live call as clients see it: queued reads booting while its
// project boots a replica, after a failed boot (until the next attempt ends)
// its message says which attempt and why the last one failed, and it carries
// its place in the queue, why it waits and when it should be done
// (estimate.go).
func (s *Scheduler) view(c *call) store.Call {
	v := c.c
	if v.State != store.CallQueued {
		return v
	}
	now := s.clk.Now()
	v.QueuePosition = c.p.queue.position(c, now)
	var est *estimate
	v.WaitingFor, est = s.explain(c, v.QueuePosition, now)
	if est != nil {
		v.ETAMs, v.ETARangeMs = &est.ms, &[2]int64{est.lo, est.hi}
	}
	p := c.p
	switch {
	case p.bootFailures > 0 && (p.booting() || p.backoffT.armed()):
		v.State, v.Message = store.CallBooting, s.bootingMessage(p)
	case p.booting():
		v.State = store.CallBooting
	}
	return v
}

// recentFailures remembers calls whose final write failed, oldest forgotten
// first, so that Lookup can still tell their waiters what happened.
type recentFailures struct {
	max   int
	calls map[string]store.Call
	order []string // ring of ids, oldest at next
	next  int
}

func newRecentFailures(n int) recentFailures {
	return recentFailures{max: n, calls: map[string]store.Call{}}
}

func (f *recentFailures) add(c store.Call) {
	if _, ok := f.calls[c.ID]; ok {
		f.calls[c.ID] = c
		return
	}
	if len(f.order) < f.max {
		f.order = append(f.order, c.ID)
	} else {
		delete(f.calls, f.order[f.next])
		f.order[f.next] = c.ID
		f.next = (f.next + 1) % f.max
	}
	f.calls[c.ID] = c
}

func (f *recentFailures) get(id string) (store.Call, bool) {
	c, ok := f.calls[id]
	return c, ok
}

// resaveQueue holds failed calls whose failure is not in the store yet, at
// most maxRecentFailures of them (the oldest are dropped first).
type resaveQueue struct{ calls []store.Call }

func (q *resaveQueue) add(c store.Call) {
	if len(q.calls) >= maxRecentFailures {
		q.calls = q.calls[1:]
	}
	q.calls = append(q.calls, c)
}

func (q *resaveQueue) len() int { return len(q.calls) }

func (q *resaveQueue) take() []store.Call {
	cs := q.calls
	q.calls = nil
	return cs
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
