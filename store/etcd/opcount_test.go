package etcd

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"inferd/store"
)

// TestOpStatsCountWhatEachCallWriteCosts: the counter sees each call write
// as one request to etcd, and counts the writes it carries out: what
// cluster mode pays for each move of a call, on every member. The table is
// the cost of each write, so that a change that adds a key to a call's
// writes shows here. Under a lease (a cluster node), a creation compares
// that the call is absent, so it sends no deletes: none of the keys it
// would delete can exist.
func TestOpStatsCountWhatEachCallWriteCosts(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		t.Run(fmt.Sprintf("fenced %v", fenced), func(t *testing.T) {
			m := startMember(t, t.TempDir())
			s := openStore(t, m, Options{Node: "node-1"})
			defer s.Close()
			creation := int64(0) // the deletes a creation sends unfenced
			if fenced {
				nodeLease(t, s, "/nodes/node-1")
				creation = 1
			}
			testCallWriteCosts(t, s, creation)
		})
	}
}

func testCallWriteCosts(t *testing.T, s *Store, creation int64) {
	now := time.Now().UTC()
	cpu := 0.1
	usage := &store.CallUsage{ReplicaSeconds: 0.01, CPUSeconds: &cpu, BytesIn: 9, BytesOut: 11}
	in, out := json.RawMessage(`{"prompt":"hi"}`), json.RawMessage(`{"ok":true}`)
	queued := store.Call{ID: "call_async", ProjectID: "p", TeamID: "t", State: store.CallQueued, Created: now, Inputs: in}
	running := queued
	running.Inputs, running.State, running.Dispatched, running.Attempt = nil, store.CallRunning, now, 1
	final := running
	final.State, final.Outputs, final.Message, final.Finished, final.Usage = store.CallSucceeded, out, "success", now, usage
	syncStart := store.Call{ID: "call_sync", ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Created: now,
		Dispatched: now, Finished: now, Attempt: 1, Inputs: in, Outputs: out, Message: "success", Usage: usage}
	for _, tc := range []struct {
		name   string
		c      store.Call
		writes int64
	}{
		{"a sync start's one write, final with its inputs", syncStart, 7 - creation},
		{"a startOnly call's first write, queued with its inputs", queued, 5 - creation},
		{"its move to running", running, 3},
		{"its final write", final, 5},
	} {
		before := s.OpStats()
		if err := s.SaveCall(context.Background(), tc.c); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		after := s.OpStats()
		if req, w := after.Requests-before.Requests, after.Writes-before.Writes; req != 1 || w != tc.writes {
			t.Errorf("%s: %d requests, %d writes; want 1 request of %d writes", tc.name, req, w, tc.writes)
		}
	}
}
