package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"inferd/store"
)

func testRecentCallsNewestFirstByTeamWithoutInputsOrOutputs(t *testing.T, e *env) {
	s := e.open(t)
	ctx := context.Background()
	var ids []string
	for i := range 5 {
		team := "acme"
		if i%2 == 1 {
			team = "other"
		}
		c := store.Call{
			ID: newCallID(), ProjectID: "p-" + team, TeamID: team, State: store.CallSucceeded,
			Inputs:  json.RawMessage(fmt.Sprintf(`{"secret":%d}`, i)),
			Outputs: json.RawMessage(`[1,2,3]`), Message: "success",
			Created: time.Unix(int64(1700000000+i), 0).UTC(), QueueMs: 3, BootMs: 4, RunMs: 5,
		}
		if err := s.SaveCall(ctx, c); err != nil {
			t.Fatal(err)
		}
		ids = append(ids, c.ID)
	}
	tests := []struct {
		name  string
		team  string
		limit int
		want  []string
	}{
		{"every team", "", 10, []string{ids[4], ids[3], ids[2], ids[1], ids[0]}},
		{"one team", "acme", 10, []string{ids[4], ids[2], ids[0]}},
		{"limited", "", 2, []string{ids[4], ids[3]}},
		{"no such team", "nobody", 10, nil},
		{"zero limit", "", 0, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			calls, err := s.RecentCalls(tc.team, tc.limit)
			if err != nil {
				t.Fatal(err)
			}
			if calls == nil {
				t.Fatal("nil slice; want an empty one")
			}
			var got []string
			for _, c := range calls {
				got = append(got, c.ID)
				if c.Inputs != nil || c.Outputs != nil {
					t.Errorf("call %s carries inputs %s / outputs %s", c.ID, c.Inputs, c.Outputs)
				}
				if c.RunMs != 5 || c.QueueMs != 3 || c.BootMs != 4 || c.Message != "success" {
					t.Errorf("call %s lost its fields: %+v", c.ID, c)
				}
			}
			if !slices.Equal(got, tc.want) {
				t.Errorf("got %v, want %v", got, tc.want)
			}
		})
	}
}

// A status page polls RecentCalls over and over: a call must show its new
// state once it changes, and an expired call must go.
func testRecentCallsFollowStateChangesAcrossPolls(t *testing.T, e *env) {
	s := e.open(t)
	ctx := context.Background()
	created := time.Unix(1700000000, 0).UTC()
	c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallRunning, Created: created}
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	state := func() []store.CallState {
		t.Helper()
		calls, err := s.RecentCalls("", 10)
		if err != nil {
			t.Fatal(err)
		}
		var got []store.CallState
		for _, c := range calls {
			got = append(got, c.State)
		}
		return got
	}
	if got := state(); !slices.Equal(got, []store.CallState{store.CallRunning}) {
		t.Fatalf("running call: %v", got)
	}
	c.State, c.Message, c.Finished = store.CallSucceeded, "success", created.Add(time.Second)
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	for range 2 { // the second poll is answered from the cache
		if got := state(); !slices.Equal(got, []store.CallState{store.CallSucceeded}) {
			t.Fatalf("finished call: %v", got)
		}
	}
	if n, err := s.ExpireCalls(created.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("ExpireCalls = %d, %v", n, err)
	}
	if got := state(); len(got) != 0 {
		t.Errorf("expired call still listed: %v", got)
	}
}

func testSaveCallAsyncAppliesInQueueOrder(t *testing.T, e *env) {
	for _, tc := range []struct {
		name   string
		states []store.CallState
	}{
		{"queued running succeeded", []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded}},
		{"queued running failed", []store.CallState{store.CallQueued, store.CallRunning, store.CallFailed}},
		{"retried after failure", []store.CallState{store.CallQueued, store.CallFailed, store.CallQueued, store.CallRunning}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := e.open(t)
			id := newCallID()
			errs := make(chan error, len(tc.states))
			for i, st := range tc.states {
				s.SaveCallAsync(store.Call{ID: id, State: st, Attempt: i}, func(err error) { errs <- err })
			}
			for range tc.states {
				if err := <-errs; err != nil {
					t.Fatal(err)
				}
			}
			final := tc.states[len(tc.states)-1]
			c, err := s.GetCall(id)
			if err != nil || c.State != final || c.Attempt != len(tc.states)-1 {
				t.Fatalf("GetCall = %+v, %v; want state %s", c, err, final)
			}
			if final.Done() && c.Finished.IsZero() {
				t.Error("final call saved without Finished did not get one")
			}
			pending, err := s.PendingCalls()
			if err != nil {
				t.Fatal(err)
			}
			if got := len(pending) == 1; got == final.Done() {
				t.Errorf("PendingCalls = %d calls for final state %s", len(pending), final)
			}
		})
	}
}

func testSaveCallRejectsBadIDAndHonoursContext(t *testing.T, e *env) {
	s := e.open(t)
	for _, tc := range []struct {
		name string
		id   string
	}{
		{"empty id", ""},
		{"huge id", string(make([]byte, 200))},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var ve *store.ValidationError
			if err := s.SaveCall(context.Background(), store.Call{ID: tc.id}); !errors.As(err, &ve) {
				t.Errorf("SaveCall = %v, want a validation error", err)
			}
		})
	}
	t.Run("cancelled context still writes", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		id := newCallID()
		err := s.SaveCall(ctx, store.Call{ID: id, State: store.CallQueued})
		if err != nil && !errors.Is(err, context.Canceled) {
			t.Fatalf("SaveCall = %v", err)
		}
		// A later durable write of another call is committed after it.
		if err := s.SaveCall(context.Background(), store.Call{ID: newCallID(), State: store.CallQueued}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetCall(id); err != nil {
			t.Errorf("write with a cancelled context was dropped: %v", err)
		}
	})
}

func testPendingCallsOldestFirst(t *testing.T, e *env) {
	s := e.open(t)
	ids := make([]string, 50)
	for i := range ids {
		ids[i] = newCallID()
	}
	order := rand.Perm(len(ids))
	var want []string
	for _, i := range order {
		st := []store.CallState{store.CallQueued, store.CallRunning, store.CallSucceeded, store.CallFailed}[i%4]
		if err := s.SaveCall(context.Background(), store.Call{ID: ids[i], State: st}); err != nil {
			t.Fatal(err)
		}
	}
	for i, id := range ids {
		if i%4 < 2 {
			want = append(want, id)
		}
	}
	got, err := s.PendingCalls()
	if err != nil {
		t.Fatal(err)
	}
	var gotIDs []string
	for _, c := range got {
		gotIDs = append(gotIDs, c.ID)
	}
	if !slices.Equal(gotIDs, want) {
		t.Errorf("PendingCalls = %v\nwant %v", gotIDs, want)
	}
}

func testExpireCallsDeletesOnlyFinishedBefore(t *testing.T, e *env) {
	s := e.open(t)
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	save := func(id string, st store.CallState, finished time.Time) {
		t.Helper()
		if err := s.SaveCall(context.Background(), store.Call{ID: id, State: st, Finished: finished}); err != nil {
			t.Fatal(err)
		}
	}
	save("call_a", store.CallSucceeded, t0)
	save("call_b", store.CallFailed, t0.Add(time.Hour))
	save("call_c", store.CallSucceeded, t0.Add(2*time.Hour))
	save("call_d", store.CallQueued, time.Time{})
	save("call_e", store.CallRunning, time.Time{})
	// Re-saved with a later finish time: the old index entry must not expire it.
	save("call_f", store.CallSucceeded, t0)
	save("call_f", store.CallSucceeded, t0.Add(3*time.Hour))
	// Finished, then retried: no longer finished, never expired.
	save("call_g", store.CallFailed, t0)
	save("call_g", store.CallQueued, time.Time{})

	for _, tc := range []struct {
		name   string
		before time.Time
		count  int
		gone   []string
	}{
		{"nothing before t0", t0, 0, nil},
		{"first hour", t0.Add(time.Hour), 1, []string{"call_a"}},
		{"same cut again", t0.Add(time.Hour), 0, []string{"call_a"}},
		{"up to 2h30", t0.Add(150 * time.Minute), 2, []string{"call_a", "call_b", "call_c"}},
		{"far future", t0.Add(1000 * time.Hour), 1, []string{"call_a", "call_b", "call_c", "call_f"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			n, err := s.ExpireCalls(tc.before)
			if err != nil || n != tc.count {
				t.Fatalf("ExpireCalls = %d, %v; want %d", n, err, tc.count)
			}
			for _, id := range []string{"call_a", "call_b", "call_c", "call_d", "call_e", "call_f", "call_g"} {
				_, err := s.GetCall(id)
				if gone := slices.Contains(tc.gone, id); gone != errors.Is(err, store.ErrNotFound) {
					t.Errorf("call %s: gone = %v, GetCall err = %v", id, gone, err)
				}
			}
		})
	}
}

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

func testCloseDrainsQueuedWrites(t *testing.T, e *env) {
	s := e.open(t)
	const n = 500
	results := make(chan error, n)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = newCallID()
		s.SaveCallAsync(store.Call{ID: ids[i], State: store.CallQueued}, func(err error) { results <- err })
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-results; err != nil {
			t.Fatalf("queued write failed: %v", err)
		}
	}
	s = e.reopen(t, s)
	pending, err := s.PendingCalls()
	if err != nil || len(pending) != n {
		t.Errorf("after reopen %d pending calls, %v; want %d", len(pending), err, n)
	}
}

func testReopenKeepsTeamsKeysProjectsAndCalls(t *testing.T, e *env) {
	s := e.open(t)
	if _, err := s.EnsureTeam("acme"); err != nil {
		t.Fatal(err)
	}
	secret, key, err := s.CreateKey("labs", store.ScopeAdmin)
	if err != nil {
		t.Fatal(err)
	}
	proj := Project("resnet", "acme")
	proj.Model.Env = map[string]string{"A": "1"}
	if _, err := s.PutProject(proj); err != nil {
		t.Fatal(err)
	}
	call := store.Call{ID: newCallID(), ProjectID: "resnet", TeamID: "acme", State: store.CallQueued,
		Inputs: json.RawMessage(`{"prompt":"hi"}`), Created: time.Now().UTC()}
	if err := s.SaveCall(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = e.reopen(t, s)
	teams, err := s.ListTeams()
	if err != nil {
		t.Fatal(err)
	}
	if len(teams) != 2 || teams[0].ID != "acme" || teams[1].ID != "labs" {
		t.Errorf("teams = %+v, want acme and labs", teams)
	}
	got, err := s.Authenticate(secret)
	if err != nil || got.ID != key.ID || got.Scope != store.ScopeAdmin {
		t.Errorf("Authenticate = %+v, %v; want key %s", got, err, key.ID)
	}
	p, err := s.ProjectByModelKey("key-resnet")
	if err != nil || p.ID != "resnet" || p.Model.Env["A"] != "1" {
		t.Errorf("ProjectByModelKey = %+v, %v", p, err)
	}
	c, err := s.GetCall(call.ID)
	if err != nil || c.State != store.CallQueued || string(c.Inputs) != `{"prompt":"hi"}` {
		t.Errorf("GetCall = %+v, %v", c, err)
	}
	pending, err := s.PendingCalls()
	if err != nil || len(pending) != 1 || pending[0].ID != call.ID {
		t.Errorf("PendingCalls = %+v, %v", pending, err)
	}
}

func testClosedStoreReturnsErrClosed(t *testing.T, e *env) {
	s := e.open(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"SaveCall", func() error {
			return s.SaveCall(context.Background(), store.Call{ID: newCallID(), State: store.CallQueued})
		}},
		{"GetCall", func() error { _, err := s.GetCall("call_x"); return err }},
		{"PutProject", func() error { _, err := s.PutProject(Project("p", "t")); return err }},
		{"Authenticate", func() error { _, err := s.Authenticate("ik_0123456789_abc"); return err }},
		{"ExpireCalls", func() error { _, err := s.ExpireCalls(time.Now()); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, store.ErrClosed) {
				t.Errorf("%s after Close = %v, want ErrClosed", tc.name, err)
			}
		})
	}
}
