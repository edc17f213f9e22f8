package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

type waitResult struct {
	c   store.Call
	err error
}

// submitWait runs SubmitWait in the background and returns its answer's channel.
func (h *harness) submitWait(ctx context.Context, p store.Project, wait time.Duration) <-chan waitResult {
	out := make(chan waitResult, 1)
	go func() {
		c, err := h.s.SubmitWait(ctx, p, json.RawMessage(`{}`), wait)
		out <- waitResult{c, err}
	}()
	return out
}

func TestSubmitWaitWritesACallThatFinishesInTimeOnceWithItsResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("sync", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		res := h.submitWait(context.Background(), p, time.Minute)
		h.call(i).reply(`{"y":2}`)
		r := <-res
		if r.err != nil || r.c.State != store.CallSucceeded || string(r.c.Outputs) != `{"y":2}` {
			t.Fatalf("SubmitWait = %+v, %v", r.c, r.err)
		}
		if got := h.st.states(r.c.ID); !slices.Equal(got, []store.CallState{store.CallSucceeded}) {
			t.Errorf("writes = %v, want only the final one, committed before SubmitWait returned", got)
		}
	})
}

func TestSubmitWaitMakesAnUnfinishedCallDurableBeforeReturningIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("sync", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		res := h.submitWait(context.Background(), p, time.Minute)
		fc := h.call(i)
		h.settle()
		h.st.mu.Lock()
		n := len(h.st.writes)
		h.st.mu.Unlock()
		if n != 0 {
			t.Fatalf("%d writes before the wait ended, want none", n)
		}
		h.advance(time.Minute)
		r := <-res
		if r.err != nil || r.c.State != store.CallRunning {
			t.Fatalf("SubmitWait = %+v, %v; want the running call", r.c, r.err)
		}
		if stored, ok := h.st.call(r.c.ID); !ok || stored.State != store.CallRunning {
			t.Fatalf("stored = %+v (%v), want the running call before its ID is handed out", stored, ok)
		}
		fc.reply(`{}`)
		if got := h.result(r.c.ID); got.State != store.CallSucceeded {
			t.Errorf("result = %+v", got)
		}
		want := []store.CallState{store.CallRunning, store.CallSucceeded}
		if got := h.st.states(r.c.ID); !slices.Equal(got, want) {
			t.Errorf("writes = %v, want %v", got, want)
		}
	})
}

func TestSubmitWaitClientGoneStillStoresTheCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("sync", minMax(0, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		ctx, cancel := context.WithCancel(context.Background())
		res := h.submitWait(ctx, p, time.Hour)
		i := h.launched()
		cancel()
		r := <-res
		if r.err != nil || r.c.State != store.CallBooting {
			t.Fatalf("SubmitWait = %+v, %v; want the booting call", r.c, r.err)
		}
		h.ready(i)
		h.call(i).reply(`{}`)
		if got := h.result(r.c.ID); got.State != store.CallSucceeded {
			t.Errorf("result = %+v: the call must run on", got)
		}
		want := []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded}
		if got := h.st.states(r.c.ID); !slices.Equal(got, want) {
			t.Errorf("writes = %v, want %v", got, want)
		}
	})
}

// TestSubmitWaitHandsOutNoIDForACallItCouldNotSave: a call that finishes
// within the wait is written once, with its result; when that write fails,
// the store knows nothing of the call, so SubmitWait returns the failure as
// an error and no call ID, which a check after a restart would not find.
func TestSubmitWaitHandsOutNoIDForACallItCouldNotSave(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("sync", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.st.setFail(func(c store.Call) error {
			if c.State.Done() {
				return errors.New("mmap: no space left on device")
			}
			return nil
		})
		res := h.submitWait(context.Background(), p, time.Minute)
		h.call(i).reply(`{"y":2}`)
		r := <-res
		if !errors.Is(r.err, errNotSaved) || r.c.ID != "" {
			t.Fatalf("SubmitWait = %+v, %v; want errNotSaved and no call", r.c, r.err)
		}
		if r.err.Error() != "storage full: the result could not be saved" {
			t.Errorf("error text %q", r.err)
		}
	})
}
