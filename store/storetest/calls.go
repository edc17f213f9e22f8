package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
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
