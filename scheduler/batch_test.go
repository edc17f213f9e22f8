package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// batching turns on a project's batching.
func batching(maxSize, maxWaitMs int) func(*store.Project) {
	return func(p *store.Project) { p.Model.Batch = store.BatchSpec{MaxSize: maxSize, MaxWaitMs: maxWaitMs} }
}

// batchOn returns the next batch waiting on i, failing if there is none.
func (h *harness) batchOn(i *fakeInstance) *fakeBatch {
	h.t.Helper()
	h.settle()
	select {
	case b := <-i.batches:
		return b
	default:
		h.t.Fatalf("no batch reached replica %s", i.spec.ReplicaID)
		return nil
	}
}

// noBatch checks that no batch (and no single call) waits on i.
func (h *harness) noBatch(i *fakeInstance) {
	h.t.Helper()
	h.settle()
	select {
	case b := <-i.batches:
		h.t.Fatalf("unexpected batch [%s] on replica %s", b.sent(), i.spec.ReplicaID)
	case c := <-i.calls:
		h.t.Fatalf("unexpected call %s on replica %s", c.inputs, i.spec.ReplicaID)
	default:
	}
}

// batchHarness runs project p with one replica, ready.
func batchHarness(t *testing.T, p store.Project) (*harness, *fakeInstance) {
	h := newHarness(t, Config{}, nil, p)
	i := h.launched()
	h.ready(i)
	return h, i
}

// busyBatchHarness is batchHarness with a first call running on the
// replica, alone (nothing ran before it), until the test answers it.
func busyBatchHarness(t *testing.T, p store.Project) (*harness, *fakeInstance, *fakeBatch) {
	h, i := batchHarness(t, p)
	h.submit(p, `{"n":0}`)
	return h, i, h.batchOn(i)
}

// submitN submits calls with inputs {"n":first} to {"n":first+count-1}.
func (h *harness) submitN(p store.Project, first, count int) []store.Call {
	var cs []store.Call
	for n := first; n < first+count; n++ {
		cs = append(cs, h.submit(p, fmt.Sprintf(`{"n":%d}`, n)))
	}
	return cs
}

// wantResult checks call id's final state, message and batch size.
func (h *harness) wantResult(id string, state store.CallState, msg string, batchSize int) store.Call {
	h.t.Helper()
	got := h.result(id)
	if got.State != state || got.Message != msg || got.BatchSize != batchSize {
		h.t.Errorf("call %s = %s %q in a batch of %d; want %s %q in a batch of %d", id, got.State, got.Message, got.BatchSize, state, msg, batchSize)
	}
	return got
}

func TestBatchCarriesTheQueuedCallsUpToMaxSizeEachGettingItsOwnOutput(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(3, 50))
		h, i := batchHarness(t, p)
		defer h.stop()

		// Nothing runs: a lone call goes at once, a batch of one.
		a := h.submit(p, `{"n":0}`)
		first := h.batchOn(i)
		if first.sent() != `{"n":0}` {
			t.Fatalf("first batch = [%s]", first.sent())
		}
		// Four more arrive while it runs (concurrency 1: no other slot).
		cs := h.submitN(p, 1, 4)
		h.noBatch(i)
		first.reply(`{"y":0}`)
		next := h.batchOn(i)
		if next.sent() != `{"n":1} {"n":2} {"n":3}` {
			t.Fatalf("second batch = [%s], want the three oldest", next.sent())
		}
		h.noBatch(i) // concurrency counts batches: one at a time
		h.clk.Advance(20 * time.Millisecond)
		next.reply(`{"y":1}`, `{"y":2}`, `{"y":3}`)
		last := h.batchOn(i)
		if last.sent() != `{"n":4}` {
			t.Fatalf("third batch = [%s]", last.sent())
		}
		last.reply(`{"y":4}`)

		h.wantResult(a.ID, store.CallSucceeded, msgSuccess, 1)
		for n, c := range cs {
			size := 3
			if n == 3 {
				size = 1
			}
			got := h.wantResult(c.ID, store.CallSucceeded, msgSuccess, size)
			if want := fmt.Sprintf(`{"y":%d}`, n+1); string(got.Outputs) != want {
				t.Errorf("call %d outputs %s, want %s", n+1, got.Outputs, want)
			}
			if got.BatchWaitMs != 0 {
				t.Errorf("call %d waited %d ms for its batch; it never waited with a slot free", n+1, got.BatchWaitMs)
			}
			// Each call is its own durable call.
			want := []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded}
			if got := h.st.states(c.ID); fmt.Sprint(got) != fmt.Sprint(want) {
				t.Errorf("call %d writes = %v, want %v", n+1, got, want)
			}
		}
		if got := h.wantResult(cs[1].ID, store.CallSucceeded, msgSuccess, 3); got.RunMs != 20 {
			t.Errorf("run time %d ms, want the batch's 20", got.RunMs)
		}
		ps := h.project("b")
		if ps.Batches != 3 || ps.MeanBatchSize != 5.0/3 {
			t.Errorf("status: %d batches of %.2f calls on average, want 3 of %.2f", ps.Batches, ps.MeanBatchSize, 5.0/3)
		}
	})
}

// batchObserver records the batches it is told of.
type batchObserver struct {
	nopObserver
	batches []string // "project size wait"
}

func (o *batchObserver) BatchDispatched(project string, size int, wait time.Duration) {
	o.batches = append(o.batches, fmt.Sprintf("%s %d %v", project, size, wait))
}

func TestALoneCallWaitsForItsBatchAtMostMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), concurrency(2), batching(4, 50))
		obs := &batchObserver{}
		h := newHarness(t, Config{Observer: obs}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		a := h.submit(p, `{"n":0}`)
		running := h.batchOn(i) // nothing ran: at once

		// Another batch runs and a slot is free: the lone call waits for
		// company, 50 ms from its arrival and no more.
		b := h.submit(p, `{"n":1}`)
		h.advance(49 * time.Millisecond)
		h.noBatch(i)
		if got := h.state(b.ID); got != store.CallQueued {
			t.Fatalf("call waiting for its batch is %s", got)
		}
		h.advance(time.Millisecond)
		lone := h.batchOn(i)
		if lone.sent() != `{"n":1}` {
			t.Fatalf("batch = [%s]", lone.sent())
		}
		lone.reply(`1`)
		running.reply(`0`)
		got := h.wantResult(b.ID, store.CallSucceeded, msgSuccess, 1)
		if got.BatchWaitMs != 50 || got.QueueMs != 50 {
			t.Errorf("batch wait %d ms, queue %d ms; want 50 and 50", got.BatchWaitMs, got.QueueMs)
		}
		h.wantResult(a.ID, store.CallSucceeded, msgSuccess, 1)
		want := []string{"b 1 0s", "b 1 50ms"}
		if fmt.Sprint(obs.batches) != fmt.Sprint(want) {
			t.Errorf("observer heard %q, want %q", obs.batches, want)
		}
	})
}

func TestBatchWaitEndsOnceMaxSizeCallsAreQueued(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), concurrency(2), batching(3, 50))
		h, i, running := busyBatchHarness(t, p)
		defer h.stop()

		b := h.submit(p, `{"n":1}`)
		h.advance(10 * time.Millisecond)
		c := h.submit(p, `{"n":2}`)
		h.advance(10 * time.Millisecond)
		h.noBatch(i)
		d := h.submit(p, `{"n":3}`) // three queued: no more waiting
		full := h.batchOn(i)
		if full.sent() != `{"n":1} {"n":2} {"n":3}` {
			t.Fatalf("batch = [%s]", full.sent())
		}
		full.reply(`1`, `2`, `3`)
		running.reply(`0`)
		for _, w := range []struct {
			id   string
			wait int64
		}{{b.ID, 20}, {c.ID, 10}, {d.ID, 0}} {
			if got := h.wantResult(w.id, store.CallSucceeded, msgSuccess, 3); got.BatchWaitMs != w.wait {
				t.Errorf("call %s waited %d ms for its batch, want %d", w.id, got.BatchWaitMs, w.wait)
			}
		}
	})
}

func TestBatchWaitNeverOutlastsAQueueTimeout(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), concurrency(2), batching(4, 5000))
		h, i, running := busyBatchHarness(t, p)
		defer h.stop()
		c, err := h.s.Start(context.Background(), p, Request{Inputs: json.RawMessage(`{"n":1}`), QueueTimeout: 1})
		if err != nil {
			t.Fatal(err)
		}
		h.advance(999 * time.Millisecond)
		h.noBatch(i)
		h.advance(time.Millisecond) // its queueTimeout, long before maxWaitMs
		h.batchOn(i).reply(`1`)
		running.reply(`0`)
		h.wantResult(c.ID, store.CallSucceeded, msgSuccess, 1)
	})
}

func TestBatchFollowsPriorityOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(2, 0))
		h, i, running := busyBatchHarness(t, p)
		defer h.stop()
		for _, pr := range []store.Priority{store.PriorityLow, store.PriorityNormal, store.PriorityHigh} {
			if _, err := h.s.Start(context.Background(), p, Request{Inputs: json.RawMessage(`"` + string(pr) + `"`), Priority: pr}); err != nil {
				t.Fatal(err)
			}
		}
		h.settle()
		running.reply(`0`)
		next := h.batchOn(i)
		if next.sent() != `"high" "normal"` {
			t.Fatalf("batch = [%s], want high then normal", next.sent())
		}
		next.reply(`1`, `2`)
		if last := h.batchOn(i); last.sent() != `"low"` {
			t.Fatalf("last batch = [%s]", last.sent())
		}
	})
}

func TestPerItemErrorFailsOnlyItsCall(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(3, 0))
		h, i, running := busyBatchHarness(t, p)
		defer h.stop()
		cs := h.submitN(p, 1, 3)
		running.reply(`0`)
		h.batchOn(i).reply(`1`, `error: image 2 is too small`, `3`)
		h.wantResult(cs[0].ID, store.CallSucceeded, msgSuccess, 3)
		h.wantResult(cs[1].ID, store.CallFailed, "error: model returned an error for this call: image 2 is too small", 3)
		h.wantResult(cs[2].ID, store.CallSucceeded, msgSuccess, 3)
	})
}

func TestABatchFailureFailsEveryCallOfItSayingSo(t *testing.T) {
	const whole = " (the whole batch of 3 calls failed)"
	for _, tc := range []struct {
		name string
		end  func(h *harness, i *fakeInstance, b *fakeBatch)
		want string
	}{
		{"model error", func(h *harness, i *fakeInstance, b *fakeBatch) { b.fail(&replicaHTTPError500) },
			"error: model returned HTTP 500: boom" + whole},
		{"wrong count", func(h *harness, i *fakeInstance, b *fakeBatch) {
			b.fail(fmt.Errorf("%w: 2 outputs for 3 inputs", backend.ErrInvalidReply))
		}, "error: model returned an invalid reply: 2 outputs for 3 inputs" + whole},
		{"crash", func(h *harness, i *fakeInstance, b *fakeBatch) { i.exit(errors.New("exit status 1"), "Killed") },
			"error: model process exited (exit status 1) during inference" + whole},
		{"timeout", func(h *harness, i *fakeInstance, b *fakeBatch) { h.advance(300 * time.Second) },
			"error: inference timed out after 300s" + whole},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("b", minMax(1, 1), batching(3, 0))
				h, i, running := busyBatchHarness(t, p)
				defer h.stop()
				cs := h.submitN(p, 1, 3)
				running.reply(`0`)
				b := h.batchOn(i)
				tc.end(h, i, b)
				for _, c := range cs {
					h.wantResult(c.ID, store.CallFailed, tc.want, 3)
				}
			})
		})
	}
}

func TestACancelledCallLeavesTheBatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(3, 0))
		h, i, running := busyBatchHarness(t, p)
		defer h.stop()

		// Cancelled while queued: it never reaches the model.
		cs := h.submitN(p, 1, 3)
		if _, err := h.s.Cancel(cs[1].ID); err != nil {
			t.Fatal(err)
		}
		running.reply(`0`)
		b := h.batchOn(i)
		if b.sent() != `{"n":1} {"n":3}` {
			t.Fatalf("batch = [%s], want the cancelled call left out", b.sent())
		}
		// Cancelled while its batch runs: it ends at once, the request goes
		// on for the other call.
		got, err := h.s.Cancel(cs[2].ID)
		if err != nil || got.Message != msgCancelled {
			t.Fatalf("Cancel = %+v, %v", got, err)
		}
		if b.ctx.Err() != nil {
			t.Fatal("cancelling one call aborted the whole batch's request")
		}
		b.reply(`1`, `3`)
		h.wantResult(cs[0].ID, store.CallSucceeded, msgSuccess, 2)
		h.wantResult(cs[1].ID, store.CallFailed, msgCancelled, 0)
		h.wantResult(cs[2].ID, store.CallFailed, msgCancelled, 2)

		// Every call of a running batch cancelled: the request is aborted,
		// and the replica takes the next call once it has returned.
		d := h.submit(p, `{"n":4}`)
		only := h.batchOn(i)
		if _, err := h.s.Cancel(d.ID); err != nil {
			t.Fatal(err)
		}
		h.settle()
		if only.ctx.Err() == nil {
			t.Fatal("the request of a batch whose calls were all cancelled goes on")
		}
		e := h.submit(p, `{"n":5}`)
		h.batchOn(i).reply(`5`)
		h.wantResult(e.ID, store.CallSucceeded, msgSuccess, 1)
	})
}

func TestAStuckBatchWhoseCallsWereCancelledStopsItsReplicaAfterAbortGrace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(3, 0))
		h := newHarness(t, Config{AbortGrace: 10 * time.Second}, nil, p)
		defer h.stop()
		i := h.launched()
		i.ignoreCancel.Store(true)
		h.ready(i)
		c := h.submit(p, `{}`)
		h.batchOn(i)
		if _, err := h.s.Cancel(c.ID); err != nil {
			t.Fatal(err)
		}
		h.advance(9 * time.Second)
		if i.wasStopped() {
			t.Fatal("stopped before AbortGrace")
		}
		h.advance(time.Second)
		if !i.wasStopped() {
			t.Fatal("a replica stuck in an aborted batch is still running after AbortGrace")
		}
	})
}

func TestARoutedCallOfABatchingProjectGoesAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(3, 0))
		h, i := batchHarness(t, p)
		defer h.stop()
		c, err := h.s.Start(context.Background(), p, Request{Inputs: json.RawMessage(`{}`), Route: "/v2"})
		if err != nil {
			t.Fatal(err)
		}
		fc := h.call(i)
		if fc.route != "/v2" {
			t.Fatalf("call went to route %q", fc.route)
		}
		fc.reply(`1`)
		h.wantResult(c.ID, store.CallSucceeded, msgSuccess, 0)
	})
}

func TestTheTeamsRunningCallsQuotaBoundsABatch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(4, 0))
		h := quotaHarness(t, nil, map[string]store.Quota{"team": {RunningCalls: 2}}, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.submit(p, `{"n":0}`)
		running := h.batchOn(i)
		h.submitN(p, 1, 4)
		running.reply(`0`)
		b := h.batchOn(i)
		if b.sent() != `{"n":1} {"n":2}` {
			t.Fatalf("batch = [%s], want two calls: the team runs at most two", b.sent())
		}
	})
}

func TestABatchingProjectWantsAReplicaPerMaxSizeCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(0, 3), batching(4, 0))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		h.submitN(p, 0, 5)
		h.launchedN(2) // five calls: two replicas of four calls each, not three
	})
}

// A batch reads the inputs of its large calls back from the store, off the
// loop; one whose inputs cannot be read fails alone and the others go.
func TestABatchReadsLargeInputsAndAnUnreadableOneFailsAlone(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(4, 0))
		h, i, running := busyBatchHarness(t, p)
		defer h.stop()
		large := func(n int) string {
			return fmt.Sprintf(`{"n":%d,"pad":"%s"}`, n, strings.Repeat("x", store.SmallPayload))
		}
		read := h.submit(p, large(1))
		small := h.submit(p, `{"n":2}`)
		running.reply(`0`)
		b := h.batchOn(i)
		if b.sent() != large(1)+` {"n":2}` {
			t.Fatalf("batch = [%.60s...], want the large call's inputs read back, then the small call", b.sent())
		}
		h.st.failInputs(errors.New("disk on fire"))
		lost := h.submit(p, large(3))
		kept := h.submit(p, `{"n":4}`)
		b.reply(`1`, `2`)
		next := h.batchOn(i)
		if next.sent() != `{"n":4}` {
			t.Fatalf("batch = [%.60s], want only the call whose inputs were read", next.sent())
		}
		next.reply(`4`)
		h.wantResult(read.ID, store.CallSucceeded, msgSuccess, 2)
		h.wantResult(small.ID, store.CallSucceeded, msgSuccess, 2)
		h.wantResult(lost.ID, store.CallFailed, msgInputsUnreadable, 2)
		if got := h.wantResult(kept.ID, store.CallSucceeded, msgSuccess, 2); string(got.Outputs) != `4` {
			t.Errorf("the call sent got output %s, want its own 4", got.Outputs)
		}
	})
}

// Sync starts of a batching project ride one batch and are each answered by
// their own result's commit: nothing answers while the final writes are
// held back, then each start gets its own output, written once (a sync
// start that finishes within its wait is never written before).
func TestSyncStartsInOneBatchEachGetTheirOwnCommittedResult(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(2, 50))
		h, i, first := busyBatchHarness(t, p)
		defer h.stop()
		res := make([]chan waitResult, 2)
		for n := range res {
			res[n] = make(chan waitResult, 1)
			go func() {
				c, err := h.s.SubmitWait(context.Background(), p, json.RawMessage(fmt.Sprintf(`{"n":%d}`, n+1)), time.Minute)
				res[n] <- waitResult{c, err}
			}()
		}
		h.settle()
		first.reply(`{"y":0}`)
		b := h.batchOn(i)
		if len(b.inputs) != 2 {
			t.Fatalf("batch = [%s], want both sync starts", b.sent())
		}
		h.st.setHold(func(c store.Call) bool { return c.State.Done() })
		outs := make([]string, len(b.inputs))
		for k, in := range b.inputs {
			outs[k] = strings.Replace(string(in), `"n"`, `"y"`, 1)
		}
		b.reply(outs...)
		for n := range res {
			h.noAnswer(res[n], "while its result's write was held back")
		}
		for range res {
			h.st.release() // one held write each
		}
		for n := range res {
			r := <-res[n]
			if want := fmt.Sprintf(`{"y":%d}`, n+1); r.err != nil || r.c.State != store.CallSucceeded || string(r.c.Outputs) != want || r.c.BatchSize != 2 {
				t.Errorf("start %d = %+v, %v; want %s from a batch of 2", n+1, r.c, r.err, want)
			}
			if got := h.st.states(r.c.ID); fmt.Sprint(got) != fmt.Sprint([]store.CallState{store.CallSucceeded}) {
				t.Errorf("start %d writes = %v, want only its final one", n+1, got)
			}
		}
	})
}
