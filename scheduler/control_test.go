package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// startReq submits req (startOnly) and waits for Start to return.
func (h *harness) startReq(p store.Project, req Request) store.Call {
	h.t.Helper()
	c, err := h.s.Start(context.Background(), p, req)
	if err != nil {
		h.t.Fatalf("Start: %v", err)
	}
	h.settle()
	return c
}

// busyReplica starts a harness for project p (at most one replica) and a
// call that its one replica works on until the test answers fc: the calls a
// test submits next wait in the queue. The caller stops h.
func busyReplica(t *testing.T, cfg Config, p store.Project) (h *harness, i *fakeInstance, fc *fakeCall, busy store.Call) {
	t.Helper()
	h = newHarness(t, cfg, nil, p)
	busy = h.submit(p, `{"n":"busy"}`)
	i = h.launched()
	h.ready(i)
	return h, i, h.call(i), busy
}

func TestCancelQueuedCallNeverReachesModel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 1))
		h, i, fc, busy := busyReplica(t, Config{}, p)
		defer h.stop()
		queued := h.submit(p, `{"n":2}`)

		got, err := h.s.Cancel(queued.ID)
		if err != nil || got.State != store.CallFailed || got.Message != msgCancelled {
			t.Fatalf("Cancel = %+v, %v; want failed, %q", got, err, msgCancelled)
		}
		if stored, _ := h.st.call(queued.ID); stored.Message != msgCancelled || store.FailureOf(stored).Kind != store.FailCancelled {
			t.Errorf("stored call = %+v; want the cancel durable when Cancel returns", stored)
		}
		after := h.submit(p, `{"n":3}`)
		fc.reply(`{}`)
		h.result(busy.ID)
		next := h.call(i) // the cancelled call is never dispatched
		if string(next.inputs) != `{"n":3}` {
			t.Fatalf("dispatched %s after the cancel; want the call behind the cancelled one", next.inputs)
		}
		next.reply(`{}`)
		h.result(after.ID)
		if _, err := h.s.Cancel(queued.ID); !errors.Is(err, ErrFinished) {
			t.Errorf("second Cancel = %v; want ErrFinished", err)
		}
		if _, err := h.s.Cancel(busy.ID); !errors.Is(err, ErrFinished) || err.Error() != "call already finished (succeeded)" {
			t.Errorf("Cancel of a finished call = %v", err)
		}
		if _, err := h.s.Cancel("call_nope"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Cancel of an unknown call = %v; want ErrNotFound", err)
		}
	})
}

// A call whose client went away (Disconnected) is aborted as a cancel
// aborts it, and says so: not "cancelled by request", which nobody asked.
func TestDisconnectedCallIsAbortedAndSaysItsClientLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 1))
		h, i, _, running := busyReplica(t, Config{AbortGrace: 5 * time.Second}, p) // never answered: only the abort ends it
		defer h.stop()
		got, err := h.s.Disconnected(running.ID)
		if err != nil || got.Message != msgDisconnected || store.FailureOf(got).Kind != store.FailDisconnected {
			t.Fatalf("Disconnected = %+v, %v", got, err)
		}
		if stored, _ := h.st.call(running.ID); store.FailureOf(stored).Kind != store.FailDisconnected {
			t.Errorf("stored call = %+v; want it disconnected", stored)
		}
		next := h.submit(p, `{"n":2}`)
		h.call(i).reply(`{}`) // the replica took the next call
		if r := h.result(next.ID); r.State != store.CallSucceeded {
			t.Errorf("next call = %+v", r)
		}
	})
}

func TestCancelRunningCallAbortsItsRequestAndFreesTheReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 1))
		h, i, _, running := busyReplica(t, Config{AbortGrace: 5 * time.Second}, p) // never answered: only the abort ends it
		defer h.stop()
		_, waiter, err := h.s.Lookup(running.ID) // a long poll's completion signal
		if err != nil {
			t.Fatal(err)
		}
		got, err := h.s.Cancel(running.ID)
		if err != nil || got.Message != msgCancelled {
			t.Fatalf("Cancel = %+v, %v", got, err)
		}
		if !isClosed(waiter) {
			t.Error("the call's waiters were not woken when Cancel returned")
		}
		next := h.submit(p, `{"n":2}`)
		h.call(i).reply(`{}`) // the replica took the next call
		if r := h.result(next.ID); r.State != store.CallSucceeded {
			t.Errorf("next call = %+v", r)
		}
		if i.wasStopped() {
			t.Error("the replica was stopped although its aborted request ended at once")
		}
	})
}

func TestCancelledCallStuckInModelReplacesReplicaAfterGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 1))
		h, i, _, running := busyReplica(t, Config{AbortGrace: 5 * time.Second}, p)
		defer h.stop()
		i.ignoreCancel.Store(true)
		if _, err := h.s.Cancel(running.ID); err != nil {
			t.Fatal(err)
		}
		next := h.submit(p, `{"n":2}`)
		h.noCall(i) // still taken by the aborted request
		h.advance(4 * time.Second)
		if i.wasStopped() {
			t.Fatal("stopped before the grace passed")
		}
		h.advance(time.Second)
		if !i.wasStopped() {
			t.Fatal("the replica whose aborted request did not end was not stopped after the grace")
		}
		j := h.launched()
		h.ready(j)
		h.call(j).reply(`{}`)
		if r := h.result(next.ID); r.State != store.CallSucceeded {
			t.Errorf("next call = %+v", r)
		}
	})
}

func TestPurgeEndsQueuedCallsOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 1))
		h, i, fc, running := busyReplica(t, Config{}, p)
		defer h.stop()
		var queued []store.Call
		for range 5 {
			queued = append(queued, h.submit(p, `{}`))
		}
		n, err := h.s.Purge("c")
		if err != nil || n != 5 {
			t.Fatalf("Purge = %d, %v; want 5", n, err)
		}
		for _, c := range queued {
			if got := h.result(c.ID); got.Message != msgQueuePurged {
				t.Errorf("purged call = %+v", got)
			}
		}
		fc.reply(`{}`)
		if got := h.result(running.ID); got.State != store.CallSucceeded {
			t.Errorf("running call = %+v; want it to run on", got)
		}
		h.noCall(i)
	})
}

func TestQueueTimeoutExpiresCallNotDispatchedInTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 1))
		h, i, fc, busy := busyReplica(t, Config{}, p)
		defer h.stop()
		late := h.startReq(p, Request{Inputs: json.RawMessage(`{"late":1}`), QueueTimeout: 2})
		inTime := h.startReq(p, Request{Inputs: json.RawMessage(`{"inTime":1}`), QueueTimeout: 10})
		h.advance(1999 * time.Millisecond)
		if st := h.state(late.ID); st != store.CallQueued {
			t.Fatalf("before its deadline the call is %s", st)
		}
		h.advance(time.Millisecond)
		if got := h.result(late.ID); got.Message != "error: expired after 2s in the queue" || store.FailureOf(got).Kind != store.FailExpired {
			t.Fatalf("expired call = %+v", got)
		}
		fc.reply(`{}`)
		h.result(busy.ID)
		c := h.call(i)
		if string(c.inputs) != `{"inTime":1}` {
			t.Fatalf("dispatched %s; the expired call must never run", c.inputs)
		}
		h.advance(time.Minute) // its deadline passes while it runs: no effect
		c.reply(`{}`)
		if got := h.result(inTime.ID); got.State != store.CallSucceeded {
			t.Errorf("call dispatched in time = %+v", got)
		}
	})
}

func TestQueueTimeoutCountsFromCreationAcrossRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 0), func(p *store.Project) { p.MaxReplicas = 1 })
		st := newTestStore(t, p)
		clk := newFakeClock()
		st.putCall(store.Call{ID: "call_old", ProjectID: "c", TeamID: "team", State: store.CallQueued,
			Created: clk.Now().Add(-time.Minute), QueueTimeout: 5, Inputs: json.RawMessage(`{}`)})
		h := startHarness(t, Config{}, cpuSlots(0), st) // no slot: nothing runs
		defer h.stop()
		if got := h.result("call_old"); got.Message != "error: expired after 5s in the queue" {
			t.Errorf("recovered call past its deadline = %+v", got)
		}
	})
}

func TestCallTimeoutOnlyLowersProjectTimeout(t *testing.T) {
	for _, tc := range []struct {
		name      string
		project   int
		call      int
		wantAfter int
	}{
		{"lower", 60, 5, 5},
		{"higher is ignored", 10, 50, 10},
		{"none", 10, 0, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("c", func(p *store.Project) { p.InferenceTimeout = tc.project })
				h := newHarness(t, Config{}, nil, p)
				defer h.stop()
				c := h.startReq(p, Request{Inputs: json.RawMessage(`{}`), Timeout: tc.call})
				i := h.launched()
				h.ready(i)
				h.call(i)
				h.advance(time.Duration(tc.wantAfter)*time.Second - time.Millisecond)
				if st := h.state(c.ID); st != store.CallRunning {
					t.Fatalf("before %ds the call is %s", tc.wantAfter, st)
				}
				h.advance(time.Millisecond)
				if got := h.result(c.ID); got.Message != fmt.Sprintf("error: inference timed out after %ds", tc.wantAfter) || store.FailureOf(got).Kind != store.FailTimeout {
					t.Errorf("result = %+v", got)
				}
			})
		})
	}
}

func TestPriorityOrderWithAging(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 1))
		h, i, fc, first := busyReplica(t, Config{PriorityAging: 30 * time.Second}, p)
		defer h.stop()
		queue := func(name string, prio store.Priority) {
			h.startReq(p, Request{Inputs: json.RawMessage(`{"n":"` + name + `"}`), Priority: prio})
		}
		// Fresh calls: high, then normal, then low, each oldest first.
		queue("low1", store.PriorityLow)
		queue("normal1", "")
		queue("high1", store.PriorityHigh)
		queue("normal2", store.PriorityNormal)
		h.advance(31 * time.Second) // one aging period: low1 ranks as normal
		queue("high2", store.PriorityHigh)
		h.advance(30 * time.Second) // two: low1 ties a fresh high, older, first
		queue("high3", store.PriorityHigh)
		fc.reply(`{}`)
		h.result(first.ID)
		var order []string
		for range 6 {
			c := h.call(i)
			var in struct{ N string }
			if err := json.Unmarshal(c.inputs, &in); err != nil {
				t.Fatal(err)
			}
			order = append(order, in.N)
			c.reply(`{}`)
		}
		// At dispatch (61 s on): high1 3+, normal1/normal2 3, low1 2,
		// high2 3 (aged once), high3 2.
		want := []string{"high1", "normal1", "normal2", "high2", "low1", "high3"}
		if fmt.Sprint(order) != fmt.Sprint(want) {
			t.Errorf("dispatch order = %v, want %v", order, want)
		}
	})
}

func TestQueuePositionFollowsPriority(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 1))
		h, _, _, _ := busyReplica(t, Config{}, p)
		defer h.stop()
		low := h.startReq(p, Request{Inputs: json.RawMessage(`{}`), Priority: store.PriorityLow})
		normal := h.startReq(p, Request{Inputs: json.RawMessage(`{}`)})
		high := h.startReq(p, Request{Inputs: json.RawMessage(`{}`), Priority: store.PriorityHigh})
		for id, want := range map[string]int{high.ID: 0, normal.ID: 1, low.ID: 2} {
			c, _, err := h.s.Lookup(id)
			if err != nil || c.QueuePosition != want {
				t.Errorf("queuePosition = %d, %v; want %d", c.QueuePosition, err, want)
			}
		}
	})
}

func TestLowCallsUseOnlyCapacityNobodyWaitsFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		batch := testProject("batch", minMax(0, 2), idleTimeout(0))
		other := testProject("other", minMax(0, 1), idleTimeout(300))
		web := testProject("web", minMax(0, 2))
		h := newHarness(t, Config{}, cpuSlots(2), batch, other, web)
		defer h.stop()
		// An idle box: a low call on a project at zero gets a replica.
		c := h.startReq(batch, Request{Inputs: json.RawMessage(`{}`), Priority: store.PriorityLow})
		b1 := h.launched()
		h.ready(b1)
		h.call(b1).reply(`{}`)
		h.result(c.ID)
		if !b1.wasStopped() { // idleTimeout 0: both slots free again
			t.Fatal("batch's idle replica was not stopped")
		}
		// other idles in one slot, web works in the other.
		h.submit(other, `{}`)
		o := h.launched()
		h.ready(o)
		h.call(o).reply(`{}`)
		h.submit(web, `{}`)
		w1 := h.launched()
		h.ready(w1)
		h.call(w1)
		// A low call waits: no slot is free, and it evicts nobody.
		h.startReq(batch, Request{Inputs: json.RawMessage(`{}`), Priority: store.PriorityLow})
		h.noLaunch()
		// A second web call evicts other's idle replica; the slot that
		// frees is web's, not the low call's that waited longer.
		h.submit(web, `{}`)
		if !o.wasStopped() {
			t.Fatal("web's waiting call did not evict the idle replica")
		}
		if got := h.launched(); got.spec.ProjectID != "web" {
			t.Fatalf("the freed slot went to %s; want web, whose normal call waits for it", got.spec.ProjectID)
		}
		h.noLaunch()
	})
}

func TestLowCallsNeverEvictOtherProjects(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		batch := testProject("batch", minMax(0, 1))
		web := testProject("web", minMax(0, 1), idleTimeout(300))
		h := newHarness(t, Config{}, cpuSlots(1), batch, web)
		defer h.stop()
		// web's replica, idle above its minimum, holds the only slot: a
		// normal call of another project would evict it, a low one must not.
		h.submit(web, `{}`)
		w := h.launched()
		h.ready(w)
		h.call(w).reply(`{}`)
		h.startReq(batch, Request{Inputs: json.RawMessage(`{}`), Priority: store.PriorityLow})
		h.noLaunch()
		if w.wasStopped() {
			t.Fatal("a low call evicted another project's replica")
		}
		// Once web's replica idles out, the low call gets the slot.
		h.advance(300 * time.Second)
		if !w.wasStopped() {
			t.Fatal("web's replica outlived its idle timeout")
		}
		b := h.launched()
		h.ready(b)
		h.call(b).reply(`{}`)
	})
}

func TestIdempotencyKeyRunsOnceAndReturnsOneCallID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c")
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		req := Request{Inputs: json.RawMessage(`{"a": 1}`), IdempotencyKey: "k1"}
		var wg sync.WaitGroup
		ids := make([]string, 3)
		for n := range 3 {
			wg.Go(func() {
				c, err := h.s.Start(context.Background(), p, req)
				if err != nil {
					t.Errorf("Start: %v", err)
				}
				ids[n] = c.ID
			})
		}
		wg.Wait()
		if ids[0] != ids[1] || ids[1] != ids[2] {
			t.Fatalf("concurrent starts with one key got %v", ids)
		}
		i := h.launched()
		h.ready(i)
		h.call(i).reply(`{}`)
		h.noCall(i)
		h.result(ids[0])
		// Later, from the store; whitespace in the inputs does not count.
		again := h.startReq(p, Request{Inputs: json.RawMessage(`{"a":1}`), IdempotencyKey: "k1"})
		if again.ID != ids[0] || again.State != store.CallSucceeded {
			t.Errorf("repeat after finish = %+v", again)
		}
		if _, err := h.s.Start(context.Background(), p, Request{Inputs: json.RawMessage(`{"a":2}`), IdempotencyKey: "k1"}); !errors.Is(err, ErrIdempotencyMismatch) {
			t.Errorf("other inputs under the key: %v; want ErrIdempotencyMismatch", err)
		}
		other := h.startReq(p, Request{Inputs: json.RawMessage(`{"a":1}`), IdempotencyKey: "k2"})
		if other.ID == ids[0] {
			t.Error("another key returned the same call")
		}
	})
}

// The store read of an idempotency key runs on the start's goroutine, not
// the loop's: a slow read (etcd) holds up no other start or status. Other
// starts with the same key wait for that read, then get the one call.
func TestIdempotencyKeyReadHoldsUpNothingElse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, other := testProject("c"), testProject("d")
		h := newHarness(t, Config{}, nil, p, other)
		defer h.stop()
		reading, release := make(chan struct{}, 4), make(chan struct{})
		slow := func() { reading <- struct{}{}; <-release }
		h.st.afterKeyRead.Store(&slow)
		req := Request{Inputs: json.RawMessage(`{"a":1}`), IdempotencyKey: "k1"}
		ids := make(chan string, 2)
		for range 2 {
			go func() {
				c, err := h.s.Start(context.Background(), p, req)
				if err != nil {
					t.Errorf("Start: %v", err)
				}
				ids <- c.ID
			}()
		}
		h.settle()
		if n := len(reading); n != 1 {
			t.Fatalf("%d store reads of the key in flight, want 1: the second start waits for the first's", n)
		}
		snapped := make(chan Status, 1)
		go func() { snapped <- h.s.Snapshot() }()
		h.settle()
		select {
		case <-snapped:
		default:
			close(release)
			t.Fatal("a status snapshot waited for a store read of an idempotency key")
		}
		h.submit(other, `{}`) // another project's start is admitted meanwhile
		release <- struct{}{}
		h.settle()
		if a, b := <-ids, <-ids; a != b {
			t.Errorf("two starts with one key got %s and %s", a, b)
		}
		close(release)
		h.settle()
		launched := h.launchedN(2) // one replica for c, one for d
		for _, i := range launched {
			h.ready(i)
			h.call(i).reply(`{}`)
			h.noCall(i)
		}
	})
}

// A start with a key that a live call holds is answered with that call,
// even when the call's final write commits while the start is on its way:
// the model runs once.
func TestIdempotencyKeyRacingTheFinalWriteRunsOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c")
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		req := Request{Inputs: json.RawMessage(`{}`), IdempotencyKey: "k1", Wait: time.Hour}
		first := make(chan store.Call, 1)
		go func() {
			c, _ := h.s.Start(context.Background(), p, req)
			first <- c
		}()
		i := h.launched()
		h.ready(i)
		running := h.call(i)
		// A read of the key from here on sees no stored call (the sync
		// start is not written yet); it is held until the call has
		// finished and its final write committed.
		release := make(chan struct{})
		hold := func() { <-release }
		h.st.afterKeyRead.Store(&hold)
		again := make(chan store.Call, 1)
		go func() {
			c, err := h.s.Start(context.Background(), p, req)
			if err != nil {
				t.Errorf("repeat: %v", err)
			}
			again <- c
		}()
		h.settle()
		running.reply(`{"n":1}`)
		h.settle()
		close(release)
		a, b := <-first, <-again
		if a.ID == "" || a.ID != b.ID || b.State != store.CallSucceeded {
			t.Errorf("the repeat got %+v; want the first call %s, succeeded", b, a.ID)
		}
		h.noCall(i)
		h.noLaunch()
	})
}

func TestRetriesRerunCrashedCallUnderSameID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", func(p *store.Project) { p.Retries = 1 })
		h := newHarness(t, Config{RestartBackoff: time.Second}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		h.ready(i)
		h.call(i)
		i.exit(errors.New("signal: killed"), "")
		h.settle()
		if st := h.state(c.ID); st != store.CallQueued && st != store.CallBooting {
			t.Fatalf("after the crash the call is %s; want queued for a retry", st)
		}
		h.advance(time.Second) // the restart backoff
		j := h.launched()
		h.ready(j)
		h.call(j).reply(`{"ok":1}`)
		got := h.result(c.ID)
		if got.State != store.CallSucceeded || got.Attempt != 2 {
			t.Errorf("result = %+v; want success on attempt 2", got)
		}
		// A second crash is not retried: retries is 1.
		d := h.submit(p, `{}`)
		h.call(j)
		j.exit(errors.New("signal: killed"), "")
		h.advance(time.Second)
		k := h.launched()
		h.ready(k)
		h.call(k)
		k.exit(errors.New("signal: killed"), "")
		if got := h.result(d.ID); got.State != store.CallFailed || got.Attempt != 2 {
			t.Errorf("twice crashed = %+v; want failed after 2 attempts", got)
		}
	})
}

func TestRetriesRerunCallInterruptedByRestart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", func(p *store.Project) { p.Retries = 1 })
		st := newTestStore(t, p)
		clk := newFakeClock()
		st.putCall(store.Call{ID: "call_a", ProjectID: "c", TeamID: "team", State: store.CallRunning,
			Created: clk.Now(), Dispatched: clk.Now(), Attempt: 1, Inputs: json.RawMessage(`{}`)})
		st.putCall(store.Call{ID: "call_b", ProjectID: "c", TeamID: "team", State: store.CallRunning,
			Created: clk.Now(), Dispatched: clk.Now(), Attempt: 2, Inputs: json.RawMessage(`{}`)})
		h := startHarness(t, Config{}, nil, st)
		defer h.stop()
		if got := h.result("call_b"); got.Message != msgInterrupted {
			t.Errorf("call out of attempts = %+v", got)
		}
		i := h.launched()
		h.ready(i)
		h.call(i).reply(`{}`)
		if got := h.result("call_a"); got.State != store.CallSucceeded || got.Attempt != 2 {
			t.Errorf("retried call = %+v", got)
		}
	})
}

func TestWarmupBootsAndAnswersWhenReady(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("c", minMax(0, 2), idleTimeout(10))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		done := make(chan error, 1)
		go func() { done <- h.s.Warmup(context.Background(), p) }()
		i := h.launched()
		select {
		case err := <-done:
			t.Fatalf("Warmup returned %v before the replica was ready", err)
		default:
		}
		h.ready(i)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		h.advance(10 * time.Second) // then it follows idleTimeout
		if !i.wasStopped() {
			t.Error("the warmed replica outlived its idle timeout")
		}
	})
}

// A call the drain deadline interrupts runs again after the restart when its
// project allows retries: it is stored queued, not failed.
func TestDrainDeadlineRequeuesCallsWithRetriesLeft(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("echo", minMax(1, 1), func(p *store.Project) { p.Retries = 1 })
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		running := h.submit(p, `{"n":1}`)
		h.call(i) // never answered
		ctx, cancel := context.WithCancel(context.Background())
		drained := make(chan int, 1)
		go func() { drained <- h.s.Drain(ctx) }()
		h.settle()
		cancel()
		h.settle()
		if n := <-drained; n != 0 {
			t.Errorf("Drain interrupted %d calls, want 0: the call has a retry left", n)
		}
		if c, _ := h.st.call(running.ID); c.State != store.CallQueued || c.Attempt != 1 {
			t.Errorf("stored call = %s attempt %d; want queued after attempt 1", c.State, c.Attempt)
		}
		h.noCall(i)
	})
}

// A project created after the scheduler started, and not reloaded yet, is
// warmed from the caller's copy.
func TestWarmupOfAProjectTheLoopHasNotLoaded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		defer h.stop()
		p := testProject("fresh")
		h.st.putProject(p)
		done := make(chan error, 1)
		go func() { done <- h.s.Warmup(context.Background(), p) }()
		i := h.launched()
		h.ready(i)
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	})
}
