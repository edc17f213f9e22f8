package scheduler

import (
	"context"
	"encoding/json"
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
		n := h.st.CallWrites()
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
