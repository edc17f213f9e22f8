package etcd

import (
	"context"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

// finalCall is a call of id finished now.
func finalCall(id string) store.Call {
	return store.Call{ID: id, ProjectID: "p", TeamID: "t", State: store.CallSucceeded,
		Outputs: []byte(`{"ok":true}`), Finished: time.Now()}
}

func saveCall(t *testing.T, s *Store, c store.Call) {
	t.Helper()
	if err := s.SaveCall(context.Background(), c); err != nil {
		t.Fatalf("SaveCall %s: %v", c.ID, err)
	}
}

// A call made final through one node is told to the OnCallFinal hooks of
// every node, this one's own writes included; a write of a call that is
// not final is not told.
func TestCallsMadeFinalThroughAnyNodeAreTold(t *testing.T) {
	n1, n2 := twoNodes(t)
	told := make(chan string, 16)
	n2.OnCallFinal(func(id string) { told <- id })
	saveCall(t, n1, store.Call{ID: "call_queued", ProjectID: "p", TeamID: "t", State: store.CallQueued})
	saveCall(t, n1, finalCall("call_other_node"))
	waitTold(t, told, "call_other_node", "final through node 1") // told of call_queued first would fail here
	saveCall(t, n2, finalCall("call_own"))
	waitTold(t, told, "call_own", "final through node 2 itself")
}

// A node cut off from etcd for a while is told, once it is back, of the
// calls made final through another node meanwhile.
func TestFinalWatchCatchesUpAfterACut(t *testing.T) {
	m := startMember(t, t.TempDir())
	link := newLink(t, strings.TrimPrefix(m.ClientURLs()[0], "http://"))
	n1 := openStore(t, m, Options{})
	n2, err := Open(Options{Endpoints: []string{"http://" + link.addr}, RequestTimeout: 500 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n1.Close(); n2.Close() })
	told := make(chan string, 16)
	n2.OnCallFinal(func(id string) { told <- id })
	saveCall(t, n1, finalCall("call_before"))
	waitTold(t, told, "call_before", "before the cut")
	link.drop()
	saveCall(t, n1, finalCall("call_during"))
	link.heal()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case id := <-told:
			if id == "call_during" {
				return
			}
			if id != "call_before" { // told again is allowed: at least once
				t.Fatalf("told of %q, want call_during", id)
			}
		case <-deadline:
			t.Fatal("the final made during the cut was not told within 30s of healing")
		}
	}
}

// A watch whose revision was compacted away lists the finished index
// again, so a call made final meanwhile is still told, and goes on
// watching from there.
func TestFinalWatchRelistsAfterCompaction(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{})
	t.Cleanup(func() { s.Close() })
	saveCall(t, s, finalCall("call_before"))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key("schema"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.cli.Compact(ctx, resp.Header.Revision); err != nil {
		t.Fatal(err)
	}
	told := make(chan string, 16)
	w := &finalWatch{}
	w.OnCallFinal(func(id string) { told <- id })
	w.start(s, 1) // long compacted: as a watch that was down through a compaction
	t.Cleanup(w.stop)
	waitTold(t, told, "call_before", "re-listed after compaction")
	saveCall(t, s, finalCall("call_after"))
	waitTold(t, told, "call_after", "watched after the re-list")
}
