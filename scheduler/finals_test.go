package scheduler

import (
	"encoding/json"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// fakeFinals is the FinalFeed of these tests: tell is another node's final
// write of a call, as the store's watch reports it.
type fakeFinals struct{ store.CallHooks }

func (f *fakeFinals) tell(id string) { f.NotifyFinal(id) }

// runningElsewhere is a call of p that another node runs: in the store,
// unknown to this node's scheduler.
func runningElsewhere(p store.Project, id string) store.Call {
	return store.Call{ID: id, ProjectID: p.ID, TeamID: p.TeamID, State: store.CallRunning, Attempt: 1}
}

func finishedFrom(c store.Call) store.Call {
	c.State, c.Outputs = store.CallSucceeded, json.RawMessage(`{"from":"node-2"}`)
	return c
}

// In cluster mode a long poll on a call that runs on another node is woken
// when the feed tells the call is final, not at the end of its wait; other
// calls' finals do not wake it.
func TestLookupOfACallRunningElsewhereWakesWhenItIsFinal(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("p", minMax(0, 1))
		feed := &fakeFinals{}
		h := newHarness(t, Config{Finals: feed}, nil, p)
		defer h.stop()
		c := runningElsewhere(p, "call_elsewhere")
		h.st.putCall(c)

		got, done, err := h.s.Lookup(c.ID)
		if err != nil || got.State != store.CallRunning {
			t.Fatalf("Lookup = %v, %v; want the call running", got.State, err)
		}
		_, done2, _ := h.s.Lookup(c.ID) // a second long poll shares the signal
		feed.tell("call_unrelated")
		if isClosed(done) || isClosed(done2) {
			t.Fatal("another call's final woke the long poll")
		}
		h.st.putCall(finishedFrom(c))
		feed.tell(c.ID)
		if !isClosed(done) || !isClosed(done2) {
			t.Fatal("the call's final through another node did not wake its long polls")
		}
		if got, _, err := h.s.Lookup(c.ID); err != nil || got.State != store.CallSucceeded {
			t.Errorf("Lookup after the final = %v, %v; want succeeded", got.State, err)
		}
	})
}

// A call made final between Lookup's read and the start of its wait (the
// feed told nobody then) is seen by the read that follows: the long poll
// answers at once instead of waiting its whole wait.
func TestLookupSeesAFinalToldBeforeItsWaitBegan(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("p", minMax(0, 1))
		feed := &fakeFinals{}
		h := newHarness(t, Config{Finals: feed}, nil, p)
		defer h.stop()
		c := runningElsewhere(p, "call_racing")
		h.st.putCall(c)
		var once atomic.Bool
		finish := func() {
			if once.CompareAndSwap(false, true) {
				h.st.putCall(finishedFrom(c))
				feed.tell(c.ID)
			}
		}
		h.st.afterResultRead.Store(&finish)

		got, done, err := h.s.Lookup(c.ID)
		if err != nil {
			t.Fatal(err)
		}
		if !isClosed(done) || got.State != store.CallSucceeded {
			t.Errorf("Lookup = %v, done closed %v; want succeeded with its signal closed", got.State, isClosed(done))
		}
	})
}

// On a single box (no feed) an unfinished call unknown to the loop keeps
// today's answer: its state, with a signal nobody closes.
func TestLookupWithoutFeedKeepsTheStoredState(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("p", minMax(0, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		c := runningElsewhere(p, "call_orphan")
		h.st.putCall(c)
		got, done, err := h.s.Lookup(c.ID)
		if err != nil || got.State != store.CallRunning || isClosed(done) {
			t.Errorf("Lookup = %v, %v, done closed %v; want running, open", got.State, err, isClosed(done))
		}
	})
}

// A wait for a call never told final is dropped once it is older than any
// call may run, so such waits do not pile up; a call told final is dropped
// at once.
func TestFinalWaitsAreDroppedWhenFinalOrTooOld(t *testing.T) {
	f := newFinalWaiters()
	t0 := time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC)
	stuck := f.wait("call_stuck", t0)
	if again := f.wait("call_stuck", t0.Add(time.Minute)); again != stuck {
		t.Fatal("a second wait for the same call got a signal of its own")
	}
	done := f.wait("call_done", t0)
	f.final("call_done")
	if !isClosed(done) {
		t.Fatal("final did not close the call's signal")
	}
	f.wait("call_late", t0.Add(finalWaitsKept+2*time.Hour)) // prunes
	if _, kept := f.waits["call_stuck"]; kept {
		t.Error("a wait older than finalWaitsKept is still kept")
	}
	if _, kept := f.waits["call_done"]; kept {
		t.Error("a call told final is still waited for")
	}
	if len(f.waits) != 1 {
		t.Errorf("waits = %v, want only call_late", f.waits)
	}
}
