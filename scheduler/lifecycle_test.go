package scheduler

import (
	"fmt"
	"testing"

	"inferd/store"
)

// everyState is every callState, for the exhaustive checks below.
var everyState = []callState{callQueued, callSaving, callRunning, callFinishing, callSucceeded, callFailed, callDropped, callAbandoned}

func TestCallLifecycleAllowsExactlyTheListedMoves(t *testing.T) {
	if len(everyState) != len(callStateNames) {
		t.Fatalf("everyState lists %d states, lifecycle.go names %d", len(everyState), len(callStateNames))
	}
	// Every allowed move, and why the loop makes it. Any pair of states not
	// listed here must be refused.
	allowedMoves := []struct {
		from, to callState
		why      string
	}{
		{callQueued, callSaving, "its first write is queued: an async start at admission, a sync start whose wait ended"},
		{callQueued, callRunning, "dispatched to a replica with room"},
		{callQueued, callFinishing, "failed in the queue: project deleted, boot failures, too few GPUs"},
		{callSaving, callQueued, "its first write committed: dispatchable, the start answered"},
		{callSaving, callDropped, "its first write failed: the start returns the error"},
		{callSaving, callFinishing, "failed in the queue before its first write committed"},
		{callRunning, callQueued, "dispatched to a replica that had already exited: back to the head of the queue"},
		{callRunning, callFinishing, "the model answered or failed, timed out, its replica exited, or its project was deleted"},
		{callFinishing, callSucceeded, "the final write of a success committed"},
		{callFinishing, callFailed, "the final write of a failure committed, or the final write failed"},
		{callQueued, callAbandoned, "cluster mode: the node's lease lapsed (Abandon), or a write was fenced"},
		{callSaving, callAbandoned, "cluster mode: the lease lapsed while its first write was in flight"},
		{callRunning, callAbandoned, "cluster mode: the lease lapsed, or its running write was fenced: its request aborted"},
		{callFinishing, callAbandoned, "cluster mode: its final write was fenced: the result discarded"},
	}
	want := map[[2]callState]bool{}
	for _, m := range allowedMoves {
		want[[2]callState{m.from, m.to}] = true
		t.Run(fmt.Sprintf("%s to %s", m.from, m.to), func(t *testing.T) {
			c := &call{c: store.Call{ID: "call_x"}, state: m.from}
			if err := c.to(m.to); err != nil || c.state != m.to {
				t.Errorf("%s (%s): to = %v, state %s", m.why, m.to, err, c.state)
			}
		})
	}
	for _, from := range everyState {
		for _, to := range everyState {
			if got := allowed(from, to); got != want[[2]callState{from, to}] {
				t.Errorf("allowed(%s, %s) = %v, the list says %v", from, to, got, !got)
			}
		}
	}
	for from := range transitions {
		for _, to := range transitions[from] {
			if !want[[2]callState{from, to}] {
				t.Errorf("transitions allows %s → %s, which this test does not list", from, to)
			}
		}
	}
}

func TestCallLifecycleRefusesAForbiddenMove(t *testing.T) {
	for _, tc := range []struct {
		name     string
		from, to callState
	}{
		{"dispatch before the first write commits", callSaving, callRunning},
		{"a result read before its write commits", callRunning, callSucceeded},
		{"a finished call run again", callSucceeded, callQueued},
		{"a dropped call run", callDropped, callRunning},
		{"an abandoned call run", callAbandoned, callRunning},
		{"an outcome decided twice", callFinishing, callFinishing},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &call{c: store.Call{ID: "call_x"}, state: tc.from}
			if err := c.to(tc.to); err == nil {
				t.Fatalf("%s → %s was allowed", tc.from, tc.to)
			}
			if c.state != tc.from {
				t.Errorf("a refused move left the call %s, want %s", c.state, tc.from)
			}
		})
	}
}
