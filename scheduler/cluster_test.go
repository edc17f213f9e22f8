package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// A call the leader hands to this node is queued and run here like one of
// its own; handed again while live here, it is not run twice; a running
// call handed on is run again when the project's retries allow, else fails
// as interrupted; a call of a project that is gone fails.
func TestAdoptRunsAHandedCallOnce(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		project store.Project
		call    store.Call
		want    store.CallState // after it ran, or at once when it never runs
		message string
		runs    bool
	}{
		{name: "queued call runs", project: testProject("p", minMax(0, 1)),
			call: store.Call{ID: "call_q", ProjectID: "p", State: store.CallQueued, Created: t0, Attempt: 1},
			want: store.CallSucceeded, message: msgSuccess, runs: true},
		{name: "running call with retries left runs again", project: testProject("p", minMax(0, 1), func(p *store.Project) { p.Retries = 1 }),
			call: store.Call{ID: "call_r", ProjectID: "p", State: store.CallRunning, Created: t0, Dispatched: t0, Attempt: 1},
			want: store.CallSucceeded, message: msgSuccess, runs: true},
		{name: "running call without retries fails", project: testProject("p", minMax(0, 1)),
			call: store.Call{ID: "call_r", ProjectID: "p", State: store.CallRunning, Created: t0, Dispatched: t0, Attempt: 1},
			want: store.CallFailed, message: msgInterrupted},
		{name: "call of a deleted project fails", project: testProject("other", minMax(0, 1)),
			call: store.Call{ID: "call_gone", ProjectID: "p", State: store.CallQueued, Created: t0},
			want: store.CallFailed, message: msgProjectDeleted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				h := newHarness(t, Config{}, nil, tc.project)
				defer h.stop()
				h.st.putCall(tc.call) // as the leader left it, pending on this node
				h.s.Adopt(tc.call)
				h.settle()
				if !tc.runs {
					h.noLaunch()
					if got := h.result(tc.call.ID); got.State != tc.want || got.Message != tc.message {
						t.Fatalf("adopted call = %+v, want %s %q", got, tc.want, tc.message)
					}
					return
				}
				i := h.launched()
				h.ready(i)
				fc := h.call(i)
				h.s.Adopt(tc.call) // handed again while live here: ignored
				h.noCall(i)
				fc.reply(`{}`)
				if got := h.result(tc.call.ID); got.State != tc.want || got.Message != tc.message {
					t.Fatalf("adopted call = %+v, want %s %q", got, tc.want, tc.message)
				}
				h.noCall(i)
			})
		})
	}
}

// oneReadyReplica runs a harness with project p, of one replica (min and
// max 1), and returns it once that replica is ready. Call h.stop.
func oneReadyReplica(t *testing.T) (store.Project, *harness, *fakeInstance) {
	t.Helper()
	p := testProject("p", minMax(1, 1))
	h := newHarness(t, Config{}, nil, p)
	i := h.launched()
	h.ready(i)
	return p, h, i
}

// A call of a project this node's loop has not loaded yet (created since
// it started, its change not told here) is adopted with the project read
// from the store.
func TestAdoptReadsAProjectNewToTheNode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		defer h.stop()
		p := testProject("fresh", minMax(0, 1))
		h.st.putProject(p)
		c := store.Call{ID: "call_f", ProjectID: "fresh", State: store.CallQueued, Created: h.clk.Now()}
		h.st.putCall(c)
		h.s.Adopt(c)
		h.succeedOnNewReplica(c.ID)
	})
}

// When the node's lease lapses, every live call is dropped without a
// write: the running call's model request is aborted, the queued call
// never runs here, waiters wake with the call as it stands, a sync start
// whose call was never stored is told to retry, a failure whose write did
// not land is left to the store, and the replica stays.
func TestAbandonDropsLiveCallsWithoutWritingAndKeepsReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p, h, i := oneReadyReplica(t)
		defer h.stop()
		// A call whose final write failed (etcd unreachable, say), kept in
		// memory to answer for it.
		failed := h.submit(p, `0`)
		h.st.setFail(func(c store.Call) error {
			if c.ID == failed.ID && c.State.Done() {
				return errors.New("etcd unreachable")
			}
			return nil
		})
		h.call(i).reply(`{}`)
		if got := h.result(failed.ID); got.Message != msgStorageFull {
			t.Fatalf("call whose final write failed = %+v", got)
		}
		running := h.submit(p, `1`)
		fc := h.call(i)
		queued := h.submit(p, `2`)
		sync := h.submitWait(context.Background(), p, time.Minute) // unsaved, queued behind
		h.settle()                                                 // admitted
		_, runDone, err := h.s.Lookup(running.ID)
		if err != nil {
			t.Fatal(err)
		}
		before := map[string][]store.CallState{running.ID: h.st.states(running.ID), queued.ID: h.st.states(queued.ID),
			failed.ID: h.st.states(failed.ID)}

		h.s.Abandon()
		h.settle()
		if !isClosed(runDone) {
			t.Error("a waiter on the running call was not woken")
		}
		r := <-sync
		if !errors.Is(r.err, store.ErrUnavailable) {
			t.Errorf("sync start of a never-stored call = %+v, %v; want cluster unavailable", r.c, r.err)
		}
		select {
		case a := <-fc.answer:
			t.Errorf("the model request was answered %v, want it aborted", a)
		default:
		}
		for id, want := range before {
			if got := h.st.states(id); !slices.Equal(got, want) {
				t.Errorf("writes of %s = %v, want %v (none after Abandon)", id, got, want)
			}
			c, done, err := h.s.Lookup(id)
			if err != nil || c.State.Done() || isClosed(done) {
				t.Errorf("Lookup(%s) after Abandon = %+v, %v; want it pending, as the store has it", id, c, err)
			}
		}
		if got := h.replicaStates("p"); len(got) != 1 || got[0] != i.spec.ReplicaID+":ready" {
			t.Errorf("replicas after Abandon = %v, want the one replica kept, ready", got)
		}
		if i.wasStopped() {
			t.Error("the replica was stopped")
		}
		// The node goes on: a new call runs on the kept replica.
		next := h.submit(p, `3`)
		h.call(i).reply(`{}`)
		if got := h.result(next.ID); got.State != store.CallSucceeded {
			t.Errorf("a call after Abandon = %+v", got)
		}
		h.noLaunch()
	})
}

// A write the store refuses because the call was handed to another node
// (store.ErrFenced) makes the scheduler forget the call: a refused result
// is discarded, not kept or written again as a failure, and a refused
// running write aborts the call's model request.
func TestFencedWritesForgetTheCall(t *testing.T) {
	fenced := func(state store.CallState) func(store.Call) error {
		return func(c store.Call) error {
			if c.State == state {
				return fmt.Errorf("save call %s: %w", c.ID, store.ErrFenced)
			}
			return nil
		}
	}
	for _, tc := range []struct {
		name   string
		refuse store.CallState // the writes of this state are fenced
		check  func(t *testing.T, h *harness, p store.Project, i *fakeInstance)
	}{
		{"final write", store.CallSucceeded, func(t *testing.T, h *harness, p store.Project, i *fakeInstance) {
			c := h.submit(p, `1`)
			h.call(i).reply(`{}`)
			h.settle()
			h.st.setFail(nil)
			got, done, err := h.s.Lookup(c.ID)
			if err != nil || got.State != store.CallRunning || isClosed(done) {
				t.Errorf("Lookup after a fenced result = %+v, %v; want the call as stored, running, and no result here", got, err)
			}
			// The next write that lands rewrites no failure of it.
			other := h.submit(p, `2`)
			h.call(i).reply(`{}`)
			h.result(other.ID)
			if got := h.st.states(c.ID); !slices.Equal(got, []store.CallState{store.CallQueued, store.CallRunning}) {
				t.Errorf("writes of the fenced call = %v, want only those before the fence", got)
			}
		}},
		{"running write", store.CallRunning, func(t *testing.T, h *harness, p store.Project, i *fakeInstance) {
			c := h.submit(p, `1`)
			h.settle()
			h.st.setFail(nil)
			h.noCall(i) // its request was aborted before the model took it
			if got := h.st.states(c.ID); !slices.Equal(got, []store.CallState{store.CallQueued}) {
				t.Errorf("writes = %v, want the first only", got)
			}
			if _, done, err := h.s.Lookup(c.ID); err != nil || isClosed(done) {
				t.Errorf("Lookup = %v, done %v; want the call pending, as stored", err, isClosed(done))
			}
		}},
		{"sync start's only write", store.CallSucceeded, func(t *testing.T, h *harness, p store.Project, i *fakeInstance) {
			res := h.submitWait(context.Background(), p, time.Minute)
			h.call(i).reply(`{}`)
			if r := <-res; !errors.Is(r.err, store.ErrUnavailable) {
				t.Errorf("SubmitWait whose result was fenced = %+v, %v; want cluster unavailable, no callID", r.c, r.err)
			}
		}},
		{"first write", store.CallQueued, func(t *testing.T, h *harness, p store.Project, i *fakeInstance) {
			if _, err := h.s.Submit(context.Background(), p, []byte(`1`)); !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("Submit whose first write is fenced = %v, want cluster unavailable", err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, h, i := oneReadyReplica(t)
				defer h.stop()
				h.st.setFail(fenced(tc.refuse))
				tc.check(t, h, p, i)
			})
		})
	}
}

// shares is a placement a test changes: project id → the node's share.
type shares struct {
	mu sync.Mutex
	m  map[string][2]int
}

func (s *shares) unset(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.m, id)
}

func (s *shares) share(id string) (int, int, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.m[id]
	return b[0], b[1], ok
}

// In cluster mode the node runs its share of a project's replicas: the
// share's minimum boots, its maximum caps a burst, a smaller share stops
// idle replicas at once, and a project not placed here runs one replica
// only for the calls of it that are here, until its idle timeout.
func TestShareBoundsTheNodesReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("p", minMax(3, 5))
		sh := &shares{m: map[string][2]int{"p": {2, 3}}}
		h := newHarness(t, Config{Share: sh.share}, nil, p)
		defer h.stop()
		is := h.launchedN(2) // the share's minimum, not the project's
		h.ready(is...)
		if got := h.project("p"); got.NodeMinReplicas != 2 || got.NodeMaxReplicas != 3 || got.MinReplicas != 3 || got.MaxReplicas != 5 {
			t.Errorf("status bounds = node %d-%d, project %d-%d; want node 2-3, project 3-5",
				got.NodeMinReplicas, got.NodeMaxReplicas, got.MinReplicas, got.MaxReplicas)
		}
		var calls []store.Call
		for n := range 5 {
			calls = append(calls, h.submit(p, fmt.Sprint(n)))
		}
		third := h.launchedN(1) // up to the share's maximum, 3
		h.ready(third...)
		is = append(is, third...)
		for _, i := range is {
			h.call(i).reply(`{}`)
		}
		for _, i := range is[:2] {
			h.call(i).reply(`{}`)
		}
		for _, c := range calls {
			if got := h.result(c.ID); got.State != store.CallSucceeded {
				t.Fatalf("%s = %+v", c.ID, got)
			}
		}

		sh.unset("p") // placed elsewhere now
		h.s.ProjectChanged("p")
		h.settle()
		if n := stoppedCount(is); n != 3 {
			t.Fatalf("%d of 3 idle replicas stopped when the node lost its share, want all", n)
		}
		// Calls here all the same (started before the placement moved, or
		// adopted) get one replica, which goes by its idle timeout.
		c1, c2 := h.submit(p, `a`), h.submit(p, `b`)
		i := h.launchedN(1)[0]
		h.ready(i)
		h.call(i).reply(`{}`)
		h.call(i).reply(`{}`)
		for _, c := range []store.Call{c1, c2} {
			if got := h.result(c.ID); got.State != store.CallSucceeded {
				t.Fatalf("%s = %+v", c.ID, got)
			}
		}
		h.advance(29 * time.Second)
		if i.wasStopped() {
			t.Error("the replica of a project not placed here was stopped before its idle timeout")
		}
		h.advance(time.Second)
		if !i.wasStopped() {
			t.Error("the replica of a project not placed here outlived its idle timeout")
		}
	})
}

// A call this node recovers at start-up whose write the store refuses
// because the leader handed it to another node meanwhile (a quick restart
// in cluster mode) is not run here: the other node's run is the one.
func TestRecoveredCallHandedElsewhereIsNotRunHere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("r", minMax(0, 1), func(p *store.Project) { p.Retries = 1 })
		st := newTestStore(t, p)
		t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
		st.putCall(store.Call{ID: "call_moved", ProjectID: "r", State: store.CallRunning, Created: t0, Dispatched: t0, Attempt: 1})
		st.setFail(func(c store.Call) error {
			if c.ID == "call_moved" {
				return fmt.Errorf("save call %s: %w", c.ID, store.ErrFenced)
			}
			return nil
		})
		h := startHarness(t, Config{}, nil, st)
		defer h.stop()
		h.noLaunch()
		if got := h.st.states("call_moved"); !slices.Equal(got, []store.CallState{store.CallRunning}) {
			t.Errorf("states of the handed call = %v, want only the stored one", got)
		}
	})
}

// A result etcd does not take within the store's bound (cluster mode, no
// quorum) ends the call with an error that says so, not "storage full": an
// async call keeps it as its message; a sync start, whose call was never
// stored, is told the cluster is unavailable, so its client retries.
func TestResultNotTakenByEtcdSaysClusterUnavailable(t *testing.T) {
	unavailable := func(c store.Call) error {
		if c.State.Done() {
			return fmt.Errorf("save call %s: %w", c.ID, store.ErrUnavailable)
		}
		return nil
	}
	t.Run("async", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, h, i := oneReadyReplica(t)
			defer h.stop()
			h.st.setFail(unavailable)
			c := h.submit(p, `1`)
			h.call(i).reply(`{}`)
			h.settle()
			got, done, err := h.s.Lookup(c.ID)
			if err != nil || !isClosed(done) || got.State != store.CallFailed || got.Message != msgResultUnavailable {
				t.Errorf("Lookup = %+v, %v; want failed with %q", got, err, msgResultUnavailable)
			}
		})
	})
	t.Run("sync", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, h, i := oneReadyReplica(t)
			defer h.stop()
			h.st.setFail(unavailable)
			res := h.submitWait(context.Background(), p, time.Minute)
			h.call(i).reply(`{}`)
			if r := <-res; !errors.Is(r.err, store.ErrUnavailable) {
				t.Errorf("SubmitWait whose only write etcd did not take = %+v, %v; want cluster unavailable", r.c, r.err)
			}
		})
	})
}

// A call whose result this node could not write (no quorum) and that the
// leader handed on meanwhile, to a node that ran it to the end: once the
// store answers, this node answers the committed result, never its own
// failure; while the store cannot answer, it says so (cluster
// unavailable) rather than its failure; and while the store holds the
// call unfinished (not handed on), its failure stands.
func TestUnsavedFailureNeverOverridesTheStoredResult(t *testing.T) {
	unavailable := fmt.Errorf("etcd: %w", store.ErrUnavailable)
	for _, tc := range []struct {
		name      string
		elsewhere bool  // another node wrote the call succeeded
		readErr   error // what the store answers a read
		want      string
		wantErr   error
	}{
		{name: "committed elsewhere", elsewhere: true, want: "success"},
		{name: "the store still unavailable", elsewhere: true, readErr: unavailable, wantErr: store.ErrUnavailable},
		{name: "not handed on", want: msgResultUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p, h, i := oneReadyReplica(t)
				defer h.stop()
				h.st.setFail(func(c store.Call) error {
					if c.State.Done() {
						return fmt.Errorf("save call %s: %w", c.ID, store.ErrUnavailable)
					}
					return nil
				})
				c := h.submit(p, `1`)
				h.call(i).reply(`"here"`)
				h.settle()
				h.st.setFail(func(store.Call) error { return nil })
				if tc.elsewhere {
					stored, _ := h.st.call(c.ID)
					stored.State, stored.Message, stored.Outputs = store.CallSucceeded, "success", json.RawMessage(`"there"`)
					stored.Finished = time.Now()
					h.st.putCall(stored)
				}
				h.st.resultErr.Store(&tc.readErr)
				got, done, err := h.s.Lookup(c.ID)
				if tc.wantErr != nil {
					if !errors.Is(err, tc.wantErr) {
						t.Errorf("Lookup = %+v, %v; want %v", got, err, tc.wantErr)
					}
					return
				}
				if err != nil || got.Message != tc.want || !isClosed(done) {
					t.Errorf("Lookup = %q (%s), %v; want %q, final", got.Message, got.Outputs, err, tc.want)
				}
			})
		})
	}
}

// A cancel whose call this node drops unfinished (cluster mode: the
// call's final write, the cancel's own or its result's, refused because
// the call was handed to another node) took no effect here: it says the
// cluster is unavailable, so the client retries where the call is now,
// never "success" nor "already finished" with the call still running.
func TestCancelOfACallHandedElsewhereSaysUnavailable(t *testing.T) {
	fenceFinal := func(c store.Call) error {
		if c.State.Done() {
			return fmt.Errorf("save call %s: %w", c.ID, store.ErrFenced)
		}
		return nil
	}
	t.Run("the cancel's write refused", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, h, i := oneReadyReplica(t)
			defer h.stop()
			c := h.submit(p, `1`)
			h.call(i) // running
			h.st.setFail(fenceFinal)
			if got, err := h.s.Cancel(c.ID); !errors.Is(err, store.ErrUnavailable) {
				t.Errorf("Cancel = %+v, %v; want cluster unavailable", got, err)
			}
		})
	})
	t.Run("the result's write refused while the cancel waits for it", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p, h, i := oneReadyReplica(t)
			defer h.stop()
			c := h.submit(p, `1`)
			h.st.setFail(fenceFinal)
			h.st.setHold(func(c store.Call) bool { return c.State.Done() })
			h.call(i).reply(`{}`)
			h.settle() // the result's write is held, in flight
			type answer struct {
				c   store.Call
				err error
			}
			res := make(chan answer, 1)
			go func() {
				got, err := h.s.Cancel(c.ID)
				res <- answer{got, err}
			}()
			h.settle()
			h.st.release()
			if r := <-res; !errors.Is(r.err, store.ErrUnavailable) {
				t.Errorf("Cancel = %+v, %v; want cluster unavailable, not the call finished as it stood (running)", r.c, r.err)
			}
		})
	})
}
