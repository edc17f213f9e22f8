package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"inferd/store"
)

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
// loses a call whose ID nobody was ever given.
//
// When ctx ends first (the client went away), SubmitWait stops waiting as if
// wait had ended; the call is never cancelled. Admission errors are
// Submit's, and ctx's error when ctx ends before the call is admitted.
func (s *Scheduler) SubmitWait(ctx context.Context, p store.Project, inputs json.RawMessage, wait time.Duration) (store.Call, error) {
	req, err := s.newSubmit(p, inputs)
	if err != nil {
		return store.Call{}, err
	}
	req.deferred = true
	select {
	case s.submitc <- req:
	case <-ctx.Done():
		return store.Call{}, ctx.Err()
	case <-s.stopped:
		return store.Call{}, errStopped
	}
	r := <-req.reply // admit answers a deferred call at once
	if r.err != nil {
		return store.Call{}, r.err
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
	}
	return s.persistNow(c)
}

// errNotSaved is SubmitWait's error for a call whose one write, the final
// one, failed: the store does not know the call, so its ID is not handed out
// (a check after a restart would say "not found"); the text is the client
// message without "error: ".
var errNotSaved = errors.New(strings.TrimPrefix(msgStorageFull, "error: "))

// finalAnswer is SubmitWait's answer for a finished call, read after done.
func finalAnswer(c *call) (store.Call, error) {
	if c.unstored {
		return store.Call{}, errNotSaved
	}
	return c.result, nil
}

type persistReq struct {
	c     *call
	reply chan persistResult // buffered: answered from the store's writer
}

type persistResult struct {
	c        store.Call
	err      error
	finished bool // the final write was already queued: wait for done
}

// persistNow makes a deferred call durable as it stands and returns it.
func (s *Scheduler) persistNow(c *call) (store.Call, error) {
	req := persistReq{c: c, reply: make(chan persistResult, 1)}
	select {
	case s.persistc <- req:
	case <-c.done:
		return finalAnswer(c)
	case <-s.stopped:
		return store.Call{}, errStopped
	}
	r := <-req.reply // the store answers every write, even after Close
	if r.finished {
		<-c.done
		return finalAnswer(c)
	}
	if r.err != nil {
		return store.Call{}, fmt.Errorf("save call: %w", r.err)
	}
	return r.c, nil
}

// persist handles persistNow on the loop. Writes apply in the order queued,
// so a running write or the final write queued later supersedes this one.
func (s *Scheduler) persist(req persistReq) {
	c := req.c
	switch {
	case c.finished():
		req.reply <- persistResult{finished: true}
	case !c.deferred:
		req.reply <- persistResult{c: s.view(c)} // persisted before
	default:
		c.deferred = false // from now on its writes are as for any call
		v := s.view(c)
		s.st.SaveCallAsync(c.c, func(err error) { req.reply <- persistResult{c: v, err: err} })
	}
}
