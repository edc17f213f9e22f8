package bolt

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

func TestRecentCallsNewestFirstByTeamWithoutInputsOrOutputs(t *testing.T) {
	s := openTest(t)
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
func TestRecentCallsFollowStateChangesAcrossPolls(t *testing.T) {
	s := openTest(t)
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

// BenchmarkRecentCallsLargeInputs is a status poll (the newest 500 calls)
// over finished calls with 100 KB inputs and outputs, as an image model's
// would be. Decoding them all on every poll took 0.53 s here; with the
// summary cache a later poll takes about 0.1 ms.
func BenchmarkRecentCallsLargeInputs(b *testing.B) {
	s := openTest(b)
	big := json.RawMessage(`{"image":"` + strings.Repeat("A", 100<<10) + `"}`)
	for range 500 {
		c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Inputs: big, Outputs: big,
			Message: "success", Created: time.Now(), Finished: time.Now()}
		if err := s.SaveCall(context.Background(), c); err != nil {
			b.Fatal(err)
		}
	}
	// The first poll decodes every record; the page's later polls are what
	// this measures.
	if _, err := s.RecentCalls("", 500); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if calls, err := s.RecentCalls("", 500); err != nil || len(calls) != 500 {
			b.Fatalf("RecentCalls = %d calls, %v", len(calls), err)
		}
	}
}
