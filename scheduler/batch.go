package scheduler

import (
	"context"
	"encoding/json"
	"math"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// Dynamic batching (a project's model.batch; docs/protocols.md "Batches").
// A batch is dispatch, not a new kind of call: the loop hands a replica up
// to batch.maxSize queued calls in one request (Instance.InferBatch), and
// each call keeps its own record, moves, timers, result and events; only
// the request is shared. A batch takes one of the replica's concurrency
// slots, so concurrency counts batches in flight.
//
// The batch is the calls at the head of the queue, in dispatch order
// (priorities, then age), up to maxSize and the team's runningCalls room,
// stopping before a call with a route (it goes alone, as a plain call) or
// one whose first write is in flight. With a slot free and fewer calls
// queued than that, the loop waits for more, at most batch.maxWaitMs from
// the first one's arrival and never past a call's queueTimeout (at that
// expiry the batch is sent instead: onQueueExpired), but only while
// another request of the project runs: with nothing running, a lone call
// has no company to wait for and waiting would only add latency, and while
// a request runs the calls that arrive meanwhile form the next batch by
// themselves.
//
// A call cancelled (or abandoned) while its batch runs ends at once; the
// request goes on for the others, and its answer for that call is dropped.
// Once every call of a batch has left it, the request is aborted and its
// slot is held, as a cancelled call's is, until it returns or AbortGrace
// stops the replica.

// batch is one request carrying several calls to a replica.
type batch struct {
	r     *rep
	calls []*call // as sent, in order
	// left counts the calls still attached to it; the last one to leave
	// (detach) aborts the request (cancel), which nobody waits for then.
	left   int
	cancel context.CancelFunc
	// holding: it holds one of r's slots, counted in r.batches, until its
	// request returns (onBatchDone); aborting: its calls all left by a
	// cancel, and its slot is counted in r.aborting instead.
	holding, aborting bool
}

// batchInput is one call's part of a batch job: its id and its inputs (nil:
// read them from the store, off the loop).
type batchInput struct {
	id     string
	inputs json.RawMessage
}

// batchResult is what the request brought one call of a batch.
type batchResult struct {
	item       backend.BatchItem
	unreadable bool // its inputs could not be read: it was left out of the request
}

// evBatchDone: a batch's InferBatch returned, or was never made (notSent)
// because the process had exited by then. results holds one per call of
// the batch when err is nil; end is the whole batch's failure otherwise.
type evBatchDone struct {
	b       *batch
	results []batchResult
	err     error
	end     ending
	notSent bool
	crashed bool
	// measured is what the backend measured over the request (nil when it
	// cannot): each call's share of it is its usage (usage.go).
	measured *backend.Usage
}

// evBatchDue: a project's batch wait has ended.
type evBatchDue struct {
	p   *project
	seq uint64
}

func (evBatchDone) isEvent() {}
func (evBatchDue) isEvent()  {}

// batching reports whether p sends its calls in batches.
func (p *project) batching() bool { return p.cfg.Model.Batch.On() }

// callsPerReplica is how many of p's calls one replica runs at once:
// concurrency requests of up to batch.maxSize calls each.
func (p *project) callsPerReplica() int {
	if p.batching() {
		return p.concurrency() * p.cfg.Model.Batch.MaxSize
	}
	return p.concurrency()
}

// slotsUsed is how many of its concurrency slots r has taken: a request for
// each call not in a batch, one per batch, and one per aborted request
// that has not returned yet.
func (r *rep) slotsUsed() int { return len(r.calls) - r.batched + r.batches + r.aborting }

// dispatchBatch sends p's next batch to r, up to maxSize calls and the
// team's runningCalls room, and reports true; or, while the batch may
// still fill, leaves it to wait (see the top of this file) and reports
// false.
func (s *Scheduler) dispatchBatch(p *project, r *rep, now time.Time) bool {
	room := min(p.cfg.Model.Batch.MaxSize, s.runRoom(p))
	if s.batchWait(p, room, now) {
		return false
	}
	s.startBatch(p, r, room, now)
	return true
}

// endBatchWait stops p's wait for a batch to fill: a dispatch pass that
// did not leave a batch waiting.
func (s *Scheduler) endBatchWait(p *project) {
	p.batchT.stop()
	p.waitSince = time.Time{}
}

// batchWait reports whether the next batch of p, of up to room calls,
// waits for more: another request of p runs, fewer than room calls are
// queued for it (a call whose first write is in flight counts once it has
// committed), and the deadline (maxWaitMs from the first one's arrival, or
// a call's queueTimeout if sooner) is still ahead. Then it makes sure the
// timer is set for the deadline.
func (s *Scheduler) batchWait(p *project, room int, now time.Time) bool {
	if p.running == 0 {
		return false
	}
	n, full := 0, false
	var deadline time.Time
	p.queue.each(now, func(c *call) bool {
		switch {
		case c.c.Route != "":
			full = true // the batch cannot grow past it: waiting would not help
			return false
		case c.state != callQueued:
			return false // its first write commits soon: then it may join
		}
		d := c.c.Created.Add(time.Duration(p.cfg.Model.Batch.MaxWaitMs) * time.Millisecond)
		if q := c.c.Created.Add(seconds(c.c.QueueTimeout)); c.c.QueueTimeout > 0 && q.Before(d) {
			d = q
		}
		if deadline.IsZero() || d.Before(deadline) {
			deadline = d
		}
		n++
		if n >= room {
			full = true
			return false
		}
		return true
	})
	if full || !now.Before(deadline) {
		return false
	}
	if p.waitSince.IsZero() {
		p.waitSince = now
	}
	if !p.batchT.armed() || !p.batchT.at.Equal(deadline) {
		s.arm(&p.batchT, deadline.Sub(now), func(seq uint64) event { return evBatchDue{p: p, seq: seq} })
	}
	return true
}

// startBatch takes the next batch of p, up to room calls, off the queue
// and runs it on r. Each call is marked running as a call alone would be
// (attach), with the batch's size and how long it waited for it to fill.
func (s *Scheduler) startBatch(p *project, r *rep, room int, now time.Time) {
	var calls []*call
	for len(calls) < room {
		c := p.queue.peek(now)
		if c == nil || c.state != callQueued || c.c.Route != "" {
			break
		}
		p.queue.pop(c)
		calls = append(calls, c)
	}
	// The batch waited to fill since waitSince, a call that came later
	// since it came.
	waitFrom := p.waitSince
	p.waitSince = time.Time{} // the next batch waits afresh
	var wait time.Duration
	if !waitFrom.IsZero() {
		wait = now.Sub(waitFrom)
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &batch{r: r, calls: calls, left: len(calls), cancel: cancel, holding: true}
	r.batches++
	r.batched += len(calls)
	inputs := make([]batchInput, len(calls))
	for i, c := range calls {
		var waited time.Duration
		if !waitFrom.IsZero() {
			waited = now.Sub(maxTime(c.c.Created, waitFrom))
		}
		c.b = b
		c.cancel = cancel // shutdown aborts every request
		s.attach(c, r, len(calls), ms(waited))
		inputs[i] = batchInput{id: c.c.ID, inputs: c.c.Inputs}
	}
	p.batches++
	p.batchedCalls += int64(len(calls))
	s.cfg.Observer.BatchDispatched(p.id, len(calls), wait)
	s.runInfer(inferJob{ctx: ctx, r: r, inst: r.inst, b: b, batch: inputs})
}

// runRoom is how many more calls p's team may run now (see runBlocked):
// unbounded without a runningCalls quota.
func (s *Scheduler) runRoom(p *project) int {
	q := s.quotas[p.cfg.TeamID]
	if q.RunningCalls == 0 {
		return math.MaxInt
	}
	return max(s.limitsOf(p.cfg.TeamID, q).running.n-s.useOf(p.cfg.TeamID).running, 0)
}

// leaveBatch detaches c from its batch (see detach); the last call to
// leave aborts the request, which nobody waits for any more.
func leaveBatch(c *call) {
	b := c.b
	c.b = nil
	b.r.batched--
	b.left--
	if b.left == 0 {
		b.cancel()
	}
}

// abortBatchCall is abortRun for a call in a batch: it ends its part, and
// when it was the last call of the batch, the aborted request holds its
// slot as an aborted call's does, until it returns or AbortGrace passes.
func (s *Scheduler) abortBatchCall(c *call) {
	b, r := c.b, c.r
	s.detach(c)
	if b.left > 0 || !b.holding {
		return
	}
	b.holding, b.aborting = false, true
	r.batches--
	s.abortStarted(r)
}

// inferBatch runs batch job j on its replica and reports the outcome, as
// infer does for one call. A call whose inputs cannot be read is left out of
// the request and fails alone.
func (s *Scheduler) inferBatch(ctx context.Context, j inferJob) {
	b, inst := j.b, j.inst
	if isClosed(inst.Exited()) {
		s.in.post(evBatchDone{b: b, notSent: true}) // as infer: back to the queue
		return
	}
	results := make([]batchResult, len(j.batch))
	send := make([]json.RawMessage, 0, len(j.batch))
	sent := make([]int, 0, len(j.batch)) // index in j.batch of each input sent
	for i, in := range j.batch {
		inputs := in.inputs
		if inputs == nil {
			var err error
			if inputs, err = s.st.CallInputs(in.id); err != nil {
				s.log.Error().Err(err).Str("call", in.id).Msg("reading a call's inputs failed")
				results[i].unreadable = true
				continue
			}
		}
		send = append(send, inputs)
		sent = append(sent, i)
		s.cfg.Outputs.CallRunning(in.id)
	}
	ev := evBatchDone{b: b, results: results}
	if len(send) > 0 {
		measured := measure(inst)
		items, err := inst.InferBatch(ctx, send)
		ev.measured = measured()
		if err != nil {
			exited := isClosed(inst.Exited())
			var exitErr error
			if exited {
				exitErr = inst.ExitErr()
			}
			ev.err, ev.end, ev.crashed = err, s.inferFailure(j.batch[0].id, err, exited, exitErr), exited
		} else {
			for k, i := range sent {
				results[i].item = items[k]
			}
		}
	}
	s.in.post(ev) // after shutdown nobody wants it: the calls stay running in the store
}

// onBatchDone gives each call still in batch b its part of the outcome and
// frees b's slot.
func (s *Scheduler) onBatchDone(ev evBatchDone) {
	b := ev.b
	r := b.r
	switch {
	case b.holding:
		b.holding = false
		r.batches--
	case b.aborting:
		b.aborting = false
		s.abortEnded(r)
	}
	if !ev.notSent && !ev.crashed && len(b.calls) > 0 {
		// A batch's run teaches its project how long one takes.
		b.r.p.est.ran(s.clk.Now().Sub(b.calls[0].c.Dispatched))
	}
	for i, c := range b.calls {
		if c.b != b || c.finished() {
			continue // it left: cancelled, timed out, or its replica went
		}
		s.detach(c)
		c.measured = ev.measured
		switch {
		case ev.notSent:
			s.requeue(c)
		case ev.err != nil && ev.crashed && s.retry(c):
		case ev.err != nil:
			s.finish(c, nil, batchFailed(ev.end, len(b.calls)))
		case ev.results[i].unreadable:
			s.finish(c, nil, failed(store.FailInferd, msgInputsUnreadable))
		case ev.results[i].item.Err != "":
			s.finish(c, nil, failed(store.FailModel, msgBatchItemFailed(ev.results[i].item.Err)))
		default:
			s.finish(c, ev.results[i].item.Output, succeeded)
		}
	}
}

// batchOf returns a failure that ends c's whole batch, if c runs in one:
// e saying so.
func batchOf(c *call, e ending) ending {
	if c.b == nil {
		return e
	}
	return batchFailed(e, len(c.b.calls))
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
