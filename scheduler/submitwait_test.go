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
		h.st.setHold(func(c store.Call) bool { return c.State.Done() })
		res := h.submitWait(context.Background(), p, time.Minute)
		h.call(i).reply(`{"y":2}`)
		h.noAnswer(res, "while the result's write was held back")
		h.st.release()
		r := <-res
		if r.err != nil || r.c.State != store.CallSucceeded || string(r.c.Outputs) != `{"y":2}` {
			t.Fatalf("SubmitWait = %+v, %v", r.c, r.err)
		}
		if got := h.st.states(r.c.ID); !slices.Equal(got, []store.CallState{store.CallSucceeded}) {
			t.Errorf("writes = %v, want only the final one, committed before SubmitWait returned", got)
		}
	})
}

// A sync start is answered by its result's commit itself, not a hop later
// through the loop: with the loop busy, the start still returns once the
// write commits, and a check of the call in between, before the loop has
// heard of the commit, reads the same result, never the call still running.
func TestSyncStartIsWokenByItsCommitAndChecksAgree(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("sync", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.st.setHold(func(c store.Call) bool { return c.State.Done() })
		res := h.submitWait(context.Background(), p, time.Minute)
		h.call(i).reply(`{"y":2}`)
		h.noAnswer(res, "while the result's write was held back")
		var r waitResult
		var seen lookupResult
		h.s.control(func() { // the loop is busy with this until it returns
			h.st.release()
			r = <-res
			seen = h.s.lookupLive(r.c.ID)
		})
		if r.err != nil || r.c.State != store.CallSucceeded || string(r.c.Outputs) != `{"y":2}` {
			t.Fatalf("SubmitWait = %+v, %v", r.c, r.err)
		}
		if !seen.found || seen.c.State != store.CallSucceeded || string(seen.c.Outputs) != `{"y":2}` || !isClosed(seen.done) {
			t.Errorf("a check before the loop heard of the commit read %+v (done closed: %v)", seen.c, seen.found && isClosed(seen.done))
		}
		if got := h.result(r.c.ID); got.State != store.CallSucceeded {
			t.Errorf("result once the loop caught up = %+v", got)
		}
	})
}

// Only a commit wakes a sync start by itself: a result whose write failed
// reaches it through the loop, as the error it is, never as the result.
func TestSyncStartWhoseWriteFailedIsNotWokenByIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("sync", minMax(1, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.st.setHold(func(c store.Call) bool { return c.State.Done() })
		h.st.setFail(diskFullOnFinalWrites)
		res := h.submitWait(context.Background(), p, time.Minute)
		h.call(i).reply(`{"y":2}`)
		h.noAnswer(res, "while the result's write was held back")
		h.s.control(func() { // the loop is busy with this until it returns
			h.st.release()
			synctest.Wait() // the write has failed, and whoever it woke has run
			select {
			case r := <-res:
				t.Errorf("answered %+v, %v by the failed write itself", r.c, r.err)
			default:
			}
		})
		if r := <-res; !errors.Is(r.err, errNotSaved) || r.c.ID != "" {
			t.Fatalf("SubmitWait = %+v, %v; want errNotSaved and no call", r.c, r.err)
		}
	})
}

// A plain sync start that admission refuses answers the refusal, also when
// its client is gone before it heard it: the start then asks the loop to
// write its call, which was never admitted, and must be told so rather than
// write (or wait for) a call that does not exist. Which way each start goes
// is the runtime's choice; sixty take both ways.
func TestRefusedSyncStartAnswersTheRefusalWhateverItsClientDid(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("full", minMax(0, 1))
		h := newHarness(t, Config{MaxQueuedPerProject: 1}, nil, p)
		defer h.stop()
		h.submit(p, `{}`) // the queue is full: nothing runs (no replica boots)
		gone, cancel := context.WithCancel(context.Background())
		cancel()
		for range 60 {
			c, err := h.s.SubmitWait(gone, p, json.RawMessage(`{}`), time.Minute)
			if c.ID != "" || (!errors.Is(err, ErrQueueFull) && !errors.Is(err, context.Canceled)) {
				t.Fatalf("SubmitWait = %+v, %v; want the queue-full refusal (or the client's own end)", c, err)
			}
		}
		if got := h.project("full").Queued; got != 1 {
			t.Errorf("queued = %d, want 1", got)
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

// noAnswer checks that a start has not answered once the scheduler has done
// all it can.
func (h *harness) noAnswer(res <-chan waitResult, why string) {
	h.t.Helper()
	h.settle()
	select {
	case r := <-res:
		h.t.Fatalf("the start answered %+v, %v %s", r.c, r.err, why)
	default:
	}
}

// submitAsync runs Submit in the background and returns its answer's channel.
func (h *harness) submitAsync(p store.Project) <-chan waitResult {
	out := make(chan waitResult, 1)
	go func() {
		c, err := h.s.Submit(context.Background(), p, json.RawMessage(`{}`))
		out <- waitResult{c, err}
	}()
	return out
}

// The design's first durability rule, on every start: a callID handed out is
// never lost, so no start answers before the call's write has committed. The
// store holds the write back; the start must wait for it.
func TestStartsAnswerOnlyAfterTheCallsWriteCommits(t *testing.T) {
	for _, tc := range []struct {
		name string
		// start submits a call of p, a project with one ready replica
		// (i), and returns the start's answer channel and the call the
		// replica got, if the call runs before the write is released.
		start func(h *harness, p store.Project, i *fakeInstance) (<-chan waitResult, *fakeCall)
		held  store.CallState // the state of the write held back
		want  store.CallState // the answer once released
	}{
		{
			name: "async start",
			start: func(h *harness, p store.Project, i *fakeInstance) (<-chan waitResult, *fakeCall) {
				res := h.submitAsync(p)
				h.noCall(i) // nor is the call run before its ID could be handed out
				return res, nil
			},
			held: store.CallQueued, want: store.CallQueued,
		},
		{
			name: "sync start that outlasts its wait while running",
			start: func(h *harness, p store.Project, i *fakeInstance) (<-chan waitResult, *fakeCall) {
				res := h.submitWait(context.Background(), p, time.Minute)
				fc := h.call(i)
				h.advance(time.Minute)
				return res, fc
			},
			held: store.CallRunning, want: store.CallRunning,
		},
		{
			name: "sync start that outlasts its wait while queued",
			start: func(h *harness, p store.Project, i *fakeInstance) (<-chan waitResult, *fakeCall) {
				h.submitWait(context.Background(), p, time.Hour) // takes the one replica
				fc := h.call(i)
				res := h.submitWait(context.Background(), p, time.Minute)
				h.advance(time.Minute)
				// The replica is free again, but the queued call must wait
				// for its write before it runs.
				fc.reply(`{}`)
				h.noCall(i)
				return res, nil
			},
			held: store.CallQueued, want: store.CallQueued,
		},
		{
			name: "sync start client gone",
			start: func(h *harness, p store.Project, i *fakeInstance) (<-chan waitResult, *fakeCall) {
				ctx, cancel := context.WithCancel(context.Background())
				res := h.submitWait(ctx, p, time.Hour)
				fc := h.call(i)
				cancel()
				return res, fc
			},
			held: store.CallRunning, want: store.CallRunning,
		},
	} {
		// durability: answered changes none of these: each hands out an ID
		// that a check must find.
		for _, durability := range []string{store.DurabilityStrict, store.DurabilityAnswered} {
			t.Run(tc.name+", "+durability, func(t *testing.T) {
				testStartAnswersAfterItsWrite(t, durability, tc.start, tc.held, tc.want)
			})
		}
	}
}

// testStartAnswersAfterItsWrite holds back the write of state held that
// start's call makes first, checks that start is not answered meanwhile,
// then that it answers want once the write is released.
func testStartAnswersAfterItsWrite(t *testing.T, durability string,
	start func(h *harness, p store.Project, i *fakeInstance) (<-chan waitResult, *fakeCall), held, want store.CallState) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("durable", minMax(1, 1), func(p *store.Project) { p.Durability = durability })
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		var heldID string
		h.st.setHold(func(c store.Call) bool {
			if heldID == "" && c.State == held && !c.State.Done() {
				heldID = c.ID // the writer goroutine alone reads and sets it
				return true
			}
			return false
		})
		res, fc := start(h, p, i)
		h.noAnswer(res, "while its write was held back")
		h.st.release()
		r := <-res
		if r.err != nil || r.c.State != want || r.c.ID != heldID {
			t.Fatalf("answer = %s %s, %v; want %s %s", r.c.ID, r.c.State, r.err, heldID, want)
		}
		if got := h.st.states(r.c.ID); len(got) == 0 || got[0] != held {
			t.Fatalf("writes = %v, want the %s write first", got, held)
		}
		if fc == nil {
			fc = h.call(i) // runs once its write has committed
		}
		fc.reply(`{}`)
		if got := h.result(r.c.ID); got.State != store.CallSucceeded {
			t.Errorf("result = %+v", got)
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
		h.st.setFail(diskFullOnFinalWrites)
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

// TestSyncStartThatAsksForMoreIsWrittenBeforeItRuns: a sync start with an
// idempotency key or a webhook is one others may learn of without its
// answer (a repeat of the key after a crash, the webhook's receiver), so it
// is written, as queued, before the model sees it; then as running and
// finished, as a startOnly call would be.
func TestSyncStartThatAsksForMoreIsWrittenBeforeItRuns(t *testing.T) {
	for name, req := range map[string]Request{
		"idempotency key": {IdempotencyKey: "k1"},
		"webhook":         {Webhook: "http://127.0.0.1:9/h", WebhookEvents: []string{store.EventCompleted}},
	} {
		t.Run(name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("sync", minMax(1, 1))
				h := newHarness(t, Config{}, nil, p)
				defer h.stop()
				i := h.launched()
				h.ready(i)
				h.st.setHold(func(c store.Call) bool { return c.State == store.CallQueued })
				res := make(chan waitResult, 1)
				go func() {
					req.Inputs, req.Wait = json.RawMessage(`{}`), time.Minute
					c, err := h.s.Start(context.Background(), p, req)
					res <- waitResult{c, err}
				}()
				h.noCall(i) // the created write is held back: the model must not see the call
				h.st.release()
				h.call(i).reply(`{"y":2}`)
				r := <-res
				if r.err != nil || r.c.State != store.CallSucceeded || string(r.c.Outputs) != `{"y":2}` {
					t.Fatalf("Start = %+v, %v", r.c, r.err)
				}
				want := []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded}
				if got := h.st.states(r.c.ID); !slices.Equal(got, want) {
					t.Errorf("writes = %v, want %v", got, want)
				}
			})
		})
	}
}
