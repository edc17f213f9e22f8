package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"time"

	"inferd/scheduler"
	"inferd/store"
)

// fakeCall is a call with its completion signal.
type fakeCall struct {
	call store.Call
	done chan struct{}
}

// fakeScheduler keeps calls in memory; tests finish them by hand, which
// closes the call's done channel exactly as the scheduler does.
type fakeScheduler struct {
	mu        sync.Mutex
	calls     map[string]*fakeCall
	n         int
	submitErr error
	// instant makes Submit finish each call at once with outputs {"ok":true}
	// (the call is still reported queued by Submit, like the real one).
	instant   bool
	submitCtx context.Context
	lookups   chan string // receives the id of every Lookup, when not full
	notReady  bool
	lastReq   scheduler.Request // what the last Start asked for
	warmErr   error             // Warmup's answer
	warmups   int               // Warmups asked for
	// lookupErr, when set, is what Lookup answers. lookupBlock, when set,
	// holds every Lookup after the first lookupFree ones until it is closed
	// (an etcd that stopped answering).
	lookupErr   error
	lookupBlock chan struct{}
	lookupFree  int
}

// Start is Submit, or SubmitWait when req.Wait is set.
// A repeated idempotency key of the team answers the call that has it.
// The events fields (webhook, route) are kept with the call.
func (f *fakeScheduler) Start(ctx context.Context, p store.Project, req scheduler.Request) (store.Call, error) {
	f.mu.Lock()
	f.lastReq = req
	if req.IdempotencyKey != "" {
		for _, fc := range f.calls {
			if fc.call.TeamID == p.TeamID && fc.call.IdempotencyKey == req.IdempotencyKey {
				c := fc.call
				f.mu.Unlock()
				return c, nil
			}
		}
	}
	f.mu.Unlock()
	keep := func(c *store.Call) {
		c.Webhook, c.WebhookEvents = req.Webhook, req.WebhookEvents
		c.Route, c.IdempotencyKey = req.Route, req.IdempotencyKey
	}
	if req.Wait > 0 {
		return f.SubmitWait(ctx, p, req.Inputs, req.Wait, keep)
	}
	return f.Submit(ctx, p, req.Inputs, keep)
}

// Cancel fails a call that is not finished with "error: cancelled by
// request".
func (f *fakeScheduler) Cancel(id string) (store.Call, error) {
	return f.end1(id, store.Failure{Kind: store.FailCancelled}, "error: cancelled by request")
}

func (f *fakeScheduler) Disconnected(id string) (store.Call, error) {
	return f.end1(id, store.Failure{Kind: store.FailDisconnected}, "error: cancelled: the client disconnected")
}

// end1 ends a pending call id as a cancel does.
func (f *fakeScheduler) end1(id string, how store.Failure, message string) (store.Call, error) {
	f.mu.Lock()
	fc, ok := f.calls[id]
	f.mu.Unlock()
	switch {
	case !ok:
		return store.Call{}, fmt.Errorf("call %s: %w", id, store.ErrNotFound)
	case fc.call.State.Done():
		return fc.call, fmt.Errorf("%w (%s)", scheduler.ErrFinished, fc.call.State)
	}
	f.fail(id, how, message)
	c, _, err := f.Lookup(id)
	return c, err
}

// Purge fails every queued call of the project.
func (f *fakeScheduler) Purge(projectID string) (int, error) {
	f.mu.Lock()
	var ids []string
	for id, fc := range f.calls {
		if fc.call.ProjectID == projectID && fc.call.State == store.CallQueued {
			ids = append(ids, id)
		}
	}
	f.mu.Unlock()
	for _, id := range ids {
		f.finish(id, store.CallFailed, "", "error: cancelled: queue purged")
	}
	return len(ids), nil
}

func (f *fakeScheduler) Warmup(context.Context, store.Project) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.warmups++
	return f.warmErr
}

func newFakeScheduler() *fakeScheduler {
	return &fakeScheduler{calls: map[string]*fakeCall{}, lookups: make(chan string, 64)}
}

func (f *fakeScheduler) Submit(ctx context.Context, p store.Project, inputs json.RawMessage, keep ...func(*store.Call)) (store.Call, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.submitCtx = ctx
	if f.submitErr != nil {
		return store.Call{}, f.submitErr
	}
	f.n++
	c := store.Call{
		ID: fmt.Sprintf("call_%d", f.n), ProjectID: p.ID, TeamID: p.TeamID,
		State: store.CallQueued, Inputs: inputs, Created: time.Now(),
	}
	for _, k := range keep {
		k(&c)
	}
	fc := &fakeCall{call: c, done: make(chan struct{})}
	f.calls[c.ID] = fc
	if f.instant {
		fc.call.State = store.CallSucceeded
		fc.call.Outputs = json.RawMessage(`{"ok":true}`)
		fc.call.Message = "success"
		close(fc.done)
	}
	return c, nil
}

// SubmitWait is Submit, then a wait like the real one's: until the call is
// done, wait passes or ctx ends.
func (f *fakeScheduler) SubmitWait(ctx context.Context, p store.Project, inputs json.RawMessage, wait time.Duration, keep ...func(*store.Call)) (store.Call, error) {
	c, err := f.Submit(context.WithoutCancel(ctx), p, inputs, keep...)
	if err != nil {
		return c, err
	}
	f.mu.Lock()
	done := f.calls[c.ID].done
	f.mu.Unlock()
	select {
	case f.lookups <- c.ID: // holding done, as after a Lookup (see waitLookup)
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[c.ID].call, nil
}

func (f *fakeScheduler) Lookup(id string) (store.Call, <-chan struct{}, error) {
	f.mu.Lock()
	block := f.lookupBlock
	if f.lookupFree > 0 {
		f.lookupFree--
		block = nil
	}
	lookupErr := f.lookupErr
	f.mu.Unlock()
	if block != nil {
		<-block
	}
	if lookupErr != nil {
		return store.Call{}, nil, lookupErr
	}
	f.mu.Lock()
	fc, ok := f.calls[id]
	var c store.Call
	var done chan struct{}
	if ok {
		c, done = fc.call, fc.done
	}
	f.mu.Unlock()
	select {
	case f.lookups <- id:
	default:
	}
	if !ok {
		return store.Call{}, nil, fmt.Errorf("call %s: %w", id, store.ErrNotFound)
	}
	return c, done, nil
}

func (f *fakeScheduler) Ready() bool { return !f.notReady }

// add stores a call as given (its done channel closed if it is final).
func (f *fakeScheduler) add(c store.Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc := &fakeCall{call: c, done: make(chan struct{})}
	if c.State.Done() {
		close(fc.done)
	}
	f.calls[c.ID] = fc
}

// finish ends a call and wakes its waiters.
func (f *fakeScheduler) finish(id string, state store.CallState, outputs, message string) {
	f.end(id, state, outputs, message, nil)
}

// fail ends call id as failed of how's kind, with message.
func (f *fakeScheduler) fail(id string, how store.Failure, message string) {
	f.end(id, store.CallFailed, "", message, &how)
}

func (f *fakeScheduler) end(id string, state store.CallState, outputs, message string, how *store.Failure) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc := f.calls[id]
	fc.call.State = state
	fc.call.Message = message
	fc.call.Failure = how
	if outputs != "" {
		fc.call.Outputs = json.RawMessage(outputs)
	}
	fc.call.Dispatched = fc.call.Created.Add(time.Millisecond)
	fc.call.QueueMs, fc.call.RunMs = 1, 7
	close(fc.done)
}
