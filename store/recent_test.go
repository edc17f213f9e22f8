package store

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"
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
		c := Call{
			ID: NewCallID(), ProjectID: "p-" + team, TeamID: team, State: CallSucceeded,
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
