package storetest

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"inferd/store"
)

// A call moves queued → running → succeeded or failed, and may be queued
// again (a retry). At each step GetCall returns what was written last,
// PendingCalls holds the call exactly while it is not final, and only a
// final call expires, by the Finished of its latest write.
func testCallStateTransitions(t *testing.T, e *env) {
	t0 := time.Date(2025, 3, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		steps []store.CallState
	}{
		{"succeeds", []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded}},
		{"fails while queued", []store.CallState{store.CallQueued, store.CallFailed}},
		{"fails while running", []store.CallState{store.CallQueued, store.CallRunning, store.CallFailed}},
		{"retried after running", []store.CallState{store.CallQueued, store.CallRunning, store.CallQueued, store.CallRunning, store.CallSucceeded}},
		{"finished, then queued again", []store.CallState{store.CallQueued, store.CallFailed, store.CallQueued}},
		{"finished twice", []store.CallState{store.CallQueued, store.CallSucceeded, store.CallFailed}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := e.open(t)
			c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", Created: t0}
			for i, st := range tc.steps {
				c.State, c.Attempt = st, i
				c.Finished = time.Time{}
				if st.Done() {
					c.Finished = t0.Add(time.Duration(i) * time.Hour)
				}
				if err := s.SaveCall(context.Background(), c); err != nil {
					t.Fatalf("step %d (%s): %v", i, st, err)
				}
				got, err := s.GetCall(c.ID)
				if err != nil || got.State != st || got.Attempt != i {
					t.Fatalf("step %d: GetCall = %s attempt %d, %v; want %s attempt %d", i, got.State, got.Attempt, err, st, i)
				}
				pending, err := s.PendingCalls()
				if err != nil {
					t.Fatal(err)
				}
				if inPending := len(pending) == 1 && pending[0].ID == c.ID; inPending == st.Done() || len(pending) > 1 {
					t.Fatalf("step %d (%s): PendingCalls = %+v", i, st, pending)
				}
			}
			last := tc.steps[len(tc.steps)-1]
			// Nothing expires before the latest Finished, whatever earlier
			// writes said.
			n, err := s.ExpireCalls(c.Finished)
			if err != nil || n != 0 {
				t.Fatalf("ExpireCalls(up to its finish) = %d, %v; want 0", n, err)
			}
			n, err = s.ExpireCalls(t0.Add(1000 * time.Hour))
			if want := map[bool]int{true: 1, false: 0}[last.Done()]; err != nil || n != want {
				t.Fatalf("ExpireCalls(far future) = %d, %v; want %d", n, err, want)
			}
			if _, err := s.GetCall(c.ID); last.Done() == (err == nil) {
				t.Errorf("after expiry of a %s call, GetCall = %v", last, err)
			}
		})
	}
}

// Many goroutines writing calls, keys and projects at once lose nothing:
// each write that returned is there, and still there after a reopen.
func testConcurrentWritersAreAllDurable(t *testing.T, e *env) {
	s := e.open(t)
	const goroutines, perG = 32, 10
	ids := make([][]string, goroutines)
	secrets := make([]string, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := range perG {
				c := store.Call{ID: newCallID(), ProjectID: "p", State: store.CallQueued,
					Inputs: []byte(fmt.Sprintf(`{"g":%d,"i":%d}`, g, i))}
				if err := s.SaveCall(context.Background(), c); err != nil {
					t.Error(err)
					return
				}
				ids[g] = append(ids[g], c.ID)
			}
			secret, _, err := s.CreateKey(fmt.Sprintf("team-%d", g), store.ScopeTeam)
			if err != nil {
				t.Error(err)
				return
			}
			secrets[g] = secret
			if _, err := s.PutProject(Project(fmt.Sprintf("p-%d", g), fmt.Sprintf("team-%d", g))); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	check := func(s store.Store) {
		t.Helper()
		for g := range goroutines {
			for i, id := range ids[g] {
				c, err := s.GetCall(id)
				if err != nil {
					t.Fatalf("call %s lost: %v", id, err)
				}
				if want := fmt.Sprintf(`{"g":%d,"i":%d}`, g, i); string(c.Inputs) != want {
					t.Errorf("call %s inputs = %s, want %s", id, c.Inputs, want)
				}
			}
			if k, err := s.Authenticate(secrets[g]); err != nil || k.TeamID != fmt.Sprintf("team-%d", g) {
				t.Errorf("key of goroutine %d: %+v, %v", g, k, err)
			}
		}
		if pending, err := s.PendingCalls(); err != nil || len(pending) != goroutines*perG {
			t.Errorf("PendingCalls = %d calls, %v; want %d", len(pending), err, goroutines*perG)
		}
		if ps, err := s.ListProjects(""); err != nil || len(ps) != goroutines {
			t.Errorf("ListProjects = %d projects, %v; want %d", len(ps), err, goroutines)
		}
		if teams, err := s.ListTeams(); err != nil || len(teams) != goroutines {
			t.Errorf("ListTeams = %d teams, %v; want %d", len(teams), err, goroutines)
		}
	}
	check(s)
	check(e.reopen(t, s))
}

// What a store committed before it closed, a revocation and a final call
// included, is what the next open finds.
func testReopenKeepsRevocationsAndFinishedCalls(t *testing.T, e *env) {
	s := e.open(t)
	secret, k, err := s.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.RevokeKey(k.ID); err != nil {
		t.Fatal(err)
	}
	done := store.Call{ID: newCallID(), State: store.CallSucceeded, Outputs: []byte(`[1]`), Message: "success"}
	if err := s.SaveCall(context.Background(), done); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteProject("none"); err == nil {
		t.Fatal("DeleteProject of a missing project succeeded")
	}
	s = e.reopen(t, s)
	if _, err := s.Authenticate(secret); err == nil {
		t.Error("a revoked key authenticates after reopen")
	}
	keys, err := s.ListKeys("acme")
	if err != nil || len(keys) != 1 || !keys[0].IsRevoked() {
		t.Errorf("ListKeys after reopen = %+v, %v; want one revoked key", keys, err)
	}
	got, err := s.GetCall(done.ID)
	if err != nil || got.State != store.CallSucceeded || string(got.Outputs) != `[1]` || !got.Finished.Equal(e.clock.Now()) {
		t.Errorf("finished call after reopen = %+v, %v; want it stamped Finished at save", got, err)
	}
	if pending, err := s.PendingCalls(); err != nil || len(pending) != 0 {
		t.Errorf("PendingCalls after reopen = %+v, %v; want none", pending, err)
	}
	if ids := callIDs(s.RecentCalls("", 10)); !slices.Equal(ids, []string{done.ID}) {
		t.Errorf("RecentCalls after reopen = %v", ids)
	}
}

func callIDs(calls []store.Call, err error) []string {
	if err != nil {
		return []string{"error: " + err.Error()}
	}
	var out []string
	for _, c := range calls {
		out = append(out, c.ID)
	}
	return out
}
