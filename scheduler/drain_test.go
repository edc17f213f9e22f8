package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// TestDrainRefusesNewCallsLetsRunningOnesFinishAndKeepsQueued: once Drain has
// begun, new calls are refused with ErrShuttingDown; the running call
// finishes and its result is durable before Drain returns; the queued call is
// neither dispatched nor given a new replica, and stays queued in the store
// for the next start.
func TestDrainRefusesNewCallsLetsRunningOnesFinishAndKeepsQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("echo", minMax(0, 2))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		running := h.submit(p, `{"n":1}`)
		i := h.launched()
		h.ready(i)
		fc := h.call(i)
		queued := h.submit(p, `{"n":2}`)
		second := h.launched() // the queued call asks for a second replica
		h.settle()

		drained := make(chan int, 1)
		go func() { drained <- h.s.Drain(context.Background()) }()
		h.settle()
		select {
		case n := <-drained:
			t.Fatalf("Drain returned (%d interrupted) while a call was running", n)
		default:
		}
		if h.s.Ready() {
			t.Error("Ready() is true while draining")
		}
		if _, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`)); !errors.Is(err, ErrShuttingDown) {
			t.Errorf("Submit while draining = %v, want ErrShuttingDown", err)
		}
		if _, err := h.s.SubmitWait(context.Background(), p, json.RawMessage(`{}`), time.Second); !errors.Is(err, ErrShuttingDown) {
			t.Errorf("SubmitWait while draining = %v, want ErrShuttingDown", err)
		}
		h.ready(second) // booted during the drain: it takes nothing
		h.noCall(second)

		fc.reply(`{"ok":true}`)
		h.settle()
		select {
		case n := <-drained:
			if n != 0 {
				t.Errorf("Drain interrupted %d calls, want 0", n)
			}
		default:
			t.Fatal("Drain did not return once the running call had finished")
		}
		if c, _ := h.st.call(running.ID); c.State != store.CallSucceeded {
			t.Errorf("the running call is stored %s, want succeeded before Drain returns", c.State)
		}
		h.noCall(i)
		h.noCall(second)
		h.noLaunch()
		if c, _ := h.st.call(queued.ID); c.State != store.CallQueued {
			t.Errorf("the queued call is stored %s, want still queued", c.State)
		}
	})
}

// TestDrainDeadlineInterruptsOnlyCallsStillRunning: when Drain's context ends
// first, the calls still running end as interrupted by a server restart,
// durably, and their waiters hear it; queued calls stay queued.
func TestDrainDeadlineInterruptsOnlyCallsStillRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("echo", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		running := h.submit(p, `{"n":1}`)
		h.call(i) // never answered
		queued := h.submit(p, `{"n":2}`)

		ctx, cancel := context.WithCancel(context.Background())
		drained := make(chan int, 1)
		go func() { drained <- h.s.Drain(ctx) }()
		h.settle()
		cancel() // shutdownTimeout has passed
		h.settle()
		select {
		case n := <-drained:
			if n != 1 {
				t.Errorf("Drain interrupted %d calls, want 1", n)
			}
		default:
			t.Fatal("Drain did not return after its context ended")
		}
		got := h.result(running.ID)
		if got.State != store.CallFailed || got.Message != msgInterrupted || store.FailureOf(got).Kind != store.FailInterrupted {
			t.Errorf("the running call = %s %q, want failed %q", got.State, got.Message, msgInterrupted)
		}
		if c, _ := h.st.call(running.ID); c.State != store.CallFailed {
			t.Errorf("the running call is stored %s, want failed", c.State)
		}
		if c, _ := h.st.call(queued.ID); c.State != store.CallQueued {
			t.Errorf("the queued call is stored %s, want queued", c.State)
		}
		h.noCall(i)
	})
}

// TestDrainReturnsAtOnceWithNothingRunning: an idle scheduler drains at once,
// and one whose Run has returned does not block Drain.
func TestDrainReturnsAtOnceWithNothingRunning(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("echo")
		h := newHarness(t, Config{}, nil, p)
		if n := h.s.Drain(context.Background()); n != 0 {
			t.Errorf("Drain = %d, want 0", n)
		}
		h.stop()
		if n := h.s.Drain(context.Background()); n != 0 {
			t.Errorf("Drain after Run returned = %d, want 0", n)
		}
	})
}
