package scheduler

import (
	"context"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

func answered(p *store.Project) { p.Durability = store.DurabilityAnswered }

// TestAnsweredProjectsSyncStartIsAnsweredBeforeItsWrite: with durability
// answered, a plain sync start that finishes within its wait is answered
// with its result while its one write is still held back; a check meanwhile
// reads the same result; the write then lands once, with that result. A
// strict project's start waits for the write (the default's promise).
func TestAnsweredProjectsSyncStartIsAnsweredBeforeItsWrite(t *testing.T) {
	for _, tc := range []struct {
		durability   string
		answersFirst bool
	}{
		{store.DurabilityStrict, false},
		{store.DurabilityAnswered, true},
	} {
		t.Run(tc.durability, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("sync", minMax(1, 1), func(p *store.Project) { p.Durability = tc.durability })
				h := newHarness(t, Config{}, nil, p)
				defer h.stop()
				i := h.launched()
				h.ready(i)
				h.st.setHold(func(c store.Call) bool { return c.State.Done() })
				res := h.submitWait(context.Background(), p, time.Minute)
				h.call(i).reply(`{"y":2}`)
				h.settle()
				var r waitResult
				select {
				case r = <-res:
					if !tc.answersFirst {
						t.Fatalf("answered %+v while the result's write was held back", r.c)
					}
				default:
					if tc.answersFirst {
						t.Fatal("no answer while the result's write was held back")
					}
					h.st.release()
					r = <-res
				}
				if r.err != nil || r.c.State != store.CallSucceeded || string(r.c.Outputs) != `{"y":2}` {
					t.Fatalf("SubmitWait = %+v, %v", r.c, r.err)
				}
				if tc.answersFirst {
					if got, _, err := h.s.Lookup(r.c.ID); err != nil || got.State != store.CallSucceeded || string(got.Outputs) != `{"y":2}` {
						t.Errorf("a check before the write landed = %+v, %v; want the answer's result", got, err)
					}
					h.st.release()
					h.settle()
				}
				if got := h.st.states(r.c.ID); !slices.Equal(got, []store.CallState{store.CallSucceeded}) {
					t.Errorf("writes = %v, want the final one only", got)
				}
			})
		})
	}
}

// TestAnsweredCallWhoseWriteFailsIsKeptAndWrittenAgain: a call answered
// before its write keeps its result when the write fails (its client has
// it): checks answer it from memory, and once the store takes writes again
// it is written as answered.
func TestAnsweredCallWhoseWriteFailsIsKeptAndWrittenAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("sync", minMax(1, 1), answered)
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.st.setFail(diskFullOnFinalWrites)
		res := h.submitWait(context.Background(), p, time.Minute)
		h.call(i).reply(`{"y":2}`)
		r := <-res
		if r.err != nil || r.c.State != store.CallSucceeded {
			t.Fatalf("SubmitWait = %+v, %v; want its result", r.c, r.err)
		}
		h.settle()
		if got, _, err := h.s.Lookup(r.c.ID); err != nil || got.State != store.CallSucceeded || string(got.Outputs) != `{"y":2}` {
			t.Errorf("a check after the failed write = %+v, %v; want the answer's result", got, err)
		}
		h.st.setFail(nil)
		next := h.submitWait(context.Background(), p, time.Minute)
		h.call(i).reply(`{}`)
		if n := <-next; n.err != nil {
			t.Fatal(n.err)
		}
		h.settle()
		if got, ok := h.st.call(r.c.ID); !ok || got.State != store.CallSucceeded || string(got.Outputs) != `{"y":2}` {
			t.Errorf("stored after the store took writes again = %+v, %v; want the answered result", got, ok)
		}
	})
}
