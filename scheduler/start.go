package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"inferd/store"
)

// Submit admits a call of project p and returns it (state queued) once it is
// durably stored, so its ID can be handed to the client: a start that does
// not wait (startOnly). It fails with an error wrapping ErrQueueFull or
// ErrNeedsGPUs when the call cannot be admitted, with the store's error when
// the call could not be saved (the call is then dropped: it never runs), and
// with ctx's error when ctx ends before the call is admitted. Once admitted,
// Submit answers when the write has committed whatever ctx does, and the call
// is never cancelled.
func (s *Scheduler) Submit(ctx context.Context, p store.Project, inputs json.RawMessage) (store.Call, error) {
	return s.Start(ctx, p, Request{Inputs: inputs})
}

// SubmitWait admits a call of project p and waits up to wait for its result:
// Submit for a caller that waits anyway (a synchronous start).
//
// Durability is as for Submit, with fewer writes: nobody knows the call's ID
// until SubmitWait returns, so there is nothing to make durable at admission.
// The call is dispatched at once, without a created or running write, and a
// call that finishes within wait is written once, with its result, before
// SubmitWait returns it. A call still unfinished when wait ends is written as
// it then stands (queued or running) and returned once that write has
// committed, so an ID the caller hands out is always durable, and a restart
// recovers the call like any other. A daemon that dies before either write
// loses a call whose ID nobody was ever given: the client sees its
// connection drop, as through any proxy, and may start it again.
//
// A sync start that asked for more than its answer (Start with an
// IdempotencyKey or a Webhook) is written before it runs, as Submit's: a
// repeat of the key after a crash finds the call rather than run the model
// again, and a webhook hears of the call's start, and of its end (after a
// crash: interrupted) even if the client never got an answer.
//
// When ctx ends first (the client went away), SubmitWait stops waiting as if
// wait had ended; the call is never cancelled. Errors are Submit's.
func (s *Scheduler) SubmitWait(ctx context.Context, p store.Project, inputs json.RawMessage, wait time.Duration) (store.Call, error) {
	return s.Start(ctx, p, Request{Inputs: inputs, Wait: wait})
}

// Request is one start: the inputs and what the client asked of the call
// (see the fields of store.Call of the same names).
type Request struct {
	Inputs json.RawMessage
	// Wait > 0 is a synchronous start (SubmitWait); 0 answers once the call
	// is admitted and durable (Submit).
	Wait         time.Duration
	Priority     store.Priority
	Timeout      int // seconds; only ever lowers the project's inferenceTimeout
	QueueTimeout int // seconds from admission; 0 = none
	// IdempotencyKey: a start with the key of a call of the same team that
	// is still kept (live, or stored within resultTTL) admits nothing and
	// answers that call as Lookup would (a sync start waits for it too), or
	// fails with ErrIdempotencyMismatch when its project or inputs differ.
	// The events' Banana Client routes pass X-Banana-Request-Id here.
	IdempotencyKey string
	// Webhook and WebhookEvents are the call's webhook (see
	// store.DeliveriesFor); the caller has checked the URL.
	Webhook       string
	WebhookEvents []string
	// Route sends the call to that route of the model (backend.Request.Route):
	// the Banana Client's POST /run/PROJECT/ROUTE.
	Route string
}

// ErrIdempotencyMismatch is Start's error for an idempotency key reused by
// a different request. The error's text is the client message without
// "error: ".
var ErrIdempotencyMismatch = errors.New("idempotencyKey reused with different inputs")

// Start admits a call of project p as req asks: Submit when req.Wait is 0,
// SubmitWait otherwise, with the same durability and errors, plus
// ErrIdempotencyMismatch. It is the one entry of every start; Submit and
// SubmitWait are Start with only inputs.
func (s *Scheduler) Start(ctx context.Context, p store.Project, req Request) (store.Call, error) {
	return s.start(ctx, p, req)
}

// startReq asks the loop to admit a new call.
type startReq struct {
	p     store.Project
	c     store.Call
	sync  bool             // a sync start: the answer carries the live call to wait on
	reply chan startResult // buffered
	// live, for a plain sync start (no idempotency key, no webhook), is
	// the call the loop admits it as, made by the caller with only its
	// done channel set: admission then answers only a refusal, and the
	// caller waits on done at once, one hand-off fewer (see awaitSync).
	live *call
	// A start with an idempotency key comes to the loop twice when no live
	// call holds its key: read is set the second time, with what the
	// store read for the key (stored, storeErr) off the loop, and gaveUp
	// when the caller's ctx ended meanwhile (idempotency.go).
	read     bool
	stored   store.Call
	storeErr error
	gaveUp   bool
}

// startResult answers a start: at admission (a sync start, or a refusal) or
// once the call's first write has committed.
type startResult struct {
	// c is the answer (a pointer: the reply channel of every start holds
	// one startResult, and a plain sync start's never carries a call).
	c         *store.Call
	call      *call // a sync start's live call, to wait on
	err       error
	finished  bool // the final write was queued first: the answer is call's result, after done
	refused   bool // a plain sync start's call was never admitted: its reply has the error
	repeat    bool // an idempotent repeat of a call the store answers for: c is the answer
	readStore bool // the loop holds the start's idempotency key: read the store and come back
}

// persistReq asks the loop to make a sync start's call durable as it stands.
type persistReq struct {
	c     *call
	reply chan startResult // buffered
}

// start is the one admission path of both starts: admit the call; for a sync
// start, wait for its result until wait or ctx ends; then, if the call has
// not finished, answer once its first write has committed (persist).
func (s *Scheduler) start(ctx context.Context, p store.Project, sr Request) (store.Call, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return store.Call{}, fmt.Errorf("new call id: %w", err)
	}
	sync, wait := sr.Wait > 0, sr.Wait
	req := startReq{
		p: p,
		c: store.Call{
			ID:             "call_" + id.String(),
			ProjectID:      p.ID,
			TeamID:         p.TeamID,
			State:          store.CallQueued,
			Inputs:         sr.Inputs,
			Created:        s.clk.Now(),
			Priority:       sr.Priority,
			Timeout:        sr.Timeout,
			QueueTimeout:   sr.QueueTimeout,
			IdempotencyKey: sr.IdempotencyKey,
			Webhook:        sr.Webhook,
			WebhookEvents:  sr.WebhookEvents,
			Route:          sr.Route,
		},
		sync:  sync,
		reply: make(chan startResult, 1),
	}
	if sr.Priority == store.PriorityNormal {
		req.c.Priority = "" // the default is not stored
	}
	if sr.IdempotencyKey != "" {
		req.c.RequestHash = store.RequestHash(p.ID, sr.Inputs)
	}
	if sync && !durableFirst(req.c) {
		req.live = &call{done: make(chan struct{})}
	}
	select {
	case s.submitc <- req:
	case <-ctx.Done():
		return store.Call{}, ctx.Err()
	case <-s.stopped:
		return store.Call{}, errStopped
	}
	if req.live != nil {
		return s.awaitSync(ctx, req.live, req.live.done, req.reply, wait)
	}
	reply := req.reply
	if sr.IdempotencyKey != "" {
		if reply, err = s.readKey(ctx, req); err != nil {
			return store.Call{}, err
		}
	}
	if sync {
		// A sync start with an idempotency key or a webhook: answered once
		// its first write has committed, or at once with the live call it
		// repeats.
		r := <-reply
		switch {
		case r.err != nil:
			return store.Call{}, r.err
		case r.repeat:
			return r.answer(), nil
		}
		c := r.call
		fired := make(chan struct{})
		t := s.clk.AfterFunc(wait, func() { close(fired) })
		defer t.Stop()
		select {
		case <-c.done:
			return finalAnswer(c)
		case <-ctx.Done():
		case <-fired:
		case <-s.stopped:
		}
		sr := persistReq{c: c, reply: make(chan startResult, 1)}
		select {
		case s.persistc <- sr:
		case <-c.done:
			return finalAnswer(c)
		case <-s.stopped:
			return store.Call{}, errStopped
		}
		reply = sr.reply
	}
	// The store answers every write, even after Close, and the answer comes
	// once the write has committed (see persist): a caller that gives up
	// meanwhile must not be told less, nor cancel the call.
	r := <-reply
	if r.finished {
		<-r.call.done
		return finalAnswer(r.call)
	}
	return r.answer(), r.err
}

// awaitSync is the rest of a plain sync start once the loop has its
// request: c is the call it admits it as, done its completion signal (read
// from the caller's own copy: the loop fills in the rest of c), and reply
// hears only of a refusal. It waits up to wait for the result; a call still
// unfinished then is made durable, and answered, as start's are.
func (s *Scheduler) awaitSync(ctx context.Context, c *call, done <-chan struct{}, reply <-chan startResult, wait time.Duration) (store.Call, error) {
	fired := make(chan struct{})
	t := s.clk.AfterFunc(wait, func() { close(fired) })
	defer t.Stop()
	select {
	case r := <-reply:
		return store.Call{}, r.err
	case <-done:
		return finalAnswer(c)
	case <-ctx.Done():
	case <-fired:
	case <-s.stopped:
	}
	// The loop took the request before the wait began, so it has admitted
	// or refused the call by the time it reads this one, and says which.
	sr := persistReq{c: c, reply: make(chan startResult, 1)}
	select {
	case s.persistc <- sr:
	case <-done:
		return finalAnswer(c)
	case <-s.stopped:
		return store.Call{}, errStopped
	}
	r := <-sr.reply
	switch {
	case r.refused:
		return store.Call{}, (<-reply).err
	case r.finished:
		<-done
		return finalAnswer(c)
	}
	return r.answer(), r.err
}

// errNotSaved is a sync start's error for a call whose one write, the final
// one, failed: the store does not know the call, so its ID is not handed out
// (a check after a restart would say "not found"); the text is the client
// message without "error: ".
var errNotSaved = errors.New(strings.TrimPrefix(msgStorageFull, "error: "))

// finalAnswer is a start's answer for a finished call, read after done: it
// reads only what the loop no longer changes once done is closed.
func finalAnswer(c *call) (store.Call, error) {
	switch {
	case c.unstored && c.result.Message == msgResultUnavailable:
		return store.Call{}, fmt.Errorf("save call: %w", store.ErrUnavailable) // the client's retry may land
	case c.unstored:
		return store.Call{}, errNotSaved
	case c.unsaved && !c.result.State.Done():
		// Abandoned (forget) before its first write: never stored, so
		// nobody can check it elsewhere.
		return store.Call{}, errLeaseLost
	}
	return c.result, nil
}

// admit takes a call into its project's queue, or refuses it. A sync start
// is answered at once with the live call; an async one once its first write
// has committed.
func (s *Scheduler) admit(req startReq) {
	if req.read {
		// The key is free again once this start is answered or admitted:
		// the starts queued behind its read come next.
		defer s.admitBehind(req)
		if req.gaveUp {
			return
		}
	}
	if s.draining.Load() { // set before Drain's event reaches the loop
		req.reply <- startResult{err: ErrShuttingDown}
		return
	}
	p := s.projects[req.p.ID]
	if p == nil || p.deleted {
		// New to the loop (created since Run started), or the caller read it
		// just before a delete: take the caller's copy, and read the store to
		// be sure it still exists.
		p = s.addProject(req.p)
		s.reload(p.id)
	}
	if req.c.IdempotencyKey != "" && s.repeated(req) {
		return
	}
	if err := fitsMachine(s.devices(), requestOf(p.cfg.Model)); err != nil {
		req.reply <- startResult{err: err}
		return
	}
	if err := s.refuse(p); err != nil {
		req.reply <- startResult{err: err}
		return
	}
	if n := p.queue.len(); n >= s.cfg.MaxQueuedPerProject {
		req.reply <- startResult{err: &queueFullError{waiting: n}}
		return
	}
	size := int64(len(req.c.Inputs))
	if err := s.admitBytes(p, size); err != nil {
		req.reply <- startResult{err: err}
		return
	}
	if err := s.admitTeam(p, size); err != nil {
		req.reply <- startResult{err: err}
		return
	}
	c := req.live
	if c == nil {
		c = &call{done: make(chan struct{})}
	}
	// Field by field: the caller reads c.done meanwhile.
	c.c, c.state, c.unsaved, c.p, c.bytes = req.c, callQueued, true, p, size
	s.calls[c.c.ID] = c
	s.index(c)
	p.queue.push(c)
	s.pass.touch(p)
	s.armExpiry(c)
	if req.live != nil {
		// Nobody knows the call's ID, so there is nothing to make durable
		// yet: dispatchable at once, and its start already waits on it.
		return
	}
	answer := s.view(c)
	s.persist(c, answer, req.reply)
}

// durableFirst reports whether a sync start is written before it runs (see
// SubmitWait): others learn of it through its idempotency key or webhook.
func durableFirst(c store.Call) bool {
	return c.IdempotencyKey != "" || c.Webhook != ""
}

// persist makes c durable as it stands, its first write, and sends answer on
// reply once that write has committed: no start hands out a callID the store
// does not hold. From here on every move of c is written. A queued call waits
// in state saving, not dispatched, until the write commits; a running one
// (a sync start that outlasted its wait) runs on.
func (s *Scheduler) persist(c *call, answer store.Call, reply chan<- startResult) {
	switch {
	case c.finished():
		reply <- startResult{call: c, finished: true}
		return
	case !c.unsaved:
		reply <- startResult{c: &answer, call: c} // saved before
		return
	}
	c.unsaved = false
	if c.state == callQueued {
		s.move(c, callSaving)
	}
	s.st.SaveCallAsync(c.c, func(err error) {
		if !s.in.post(evPersisted{c: c, err: err, answer: answer, reply: reply}) {
			r := persistedResult(answer, err)
			r.call = c
			reply <- r
		}
	})
}

// onPersisted answers the start of a call whose first write has committed, and
// makes the call dispatchable. A call whose write failed and that is still
// waiting for it is dropped: the start returns the error, so nobody will ever
// know its ID.
func (s *Scheduler) onPersisted(ev evPersisted) {
	c := ev.c
	s.pass.touch(c.p)
	switch {
	case c.state == callSaving && ev.err != nil:
		c.p.queue.remove(c)
		c.expiry.stop()
		delete(s.calls, c.c.ID)
		s.unindex(c)
		s.move(c, callDropped)
		close(c.done)
	case c.state == callSaving:
		s.move(c, callQueued)
	}
	if ev.err == nil && len(c.c.Inputs) > store.SmallPayload {
		// Durable now: the queue keeps the call's metadata only, and the
		// inputs are read back when it is dispatched. A call already
		// running has handed them to its Infer goroutine. Small inputs
		// stay: they cost what the metadata does, and every later write
		// carries them as the store keeps them, in the record.
		c.c.Inputs = nil
	}
	r := persistedResult(ev.answer, ev.err)
	r.call = c // a sync start waits on it
	ev.reply <- r
}

func persistedResult(answer store.Call, err error) startResult {
	if errors.Is(err, store.ErrFenced) {
		// Written under a lease this node no longer holds: it was cut off.
		return startResult{err: errLeaseLost}
	}
	if err != nil {
		return startResult{err: fmt.Errorf("save call: %w", err)}
	}
	return startResult{c: &answer}
}

// answer is r's call, zero when it carries none.
func (r startResult) answer() store.Call {
	if r.c == nil {
		return store.Call{}
	}
	return *r.c
}
