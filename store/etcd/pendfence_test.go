package etcd

import (
	"context"
	"errors"
	"testing"
	"time"

	"inferd/store"
)

// leasedNode opens node's store over m with its key under a new lease, as
// a node process does at its first session.
func leasedNode(t *testing.T, m *Member, node string) *Store {
	t.Helper()
	s := openStore(t, m, Options{Node: node})
	t.Cleanup(func() { s.Close() })
	nodeLease(t, s, s.Prefix()+"nodes/"+node)
	return s
}

// restartedAndHandedOn is node a restarted quickly after a clean
// shutdown: its old process wrote call_1 running (and call_mine queued)
// and revoked its lease at exit; the new process holds a new lease and
// has recovered both (PendingCalls), and the leader, which saw the old
// key go, has meanwhile handed call_1 to node b. It returns a's new
// store, the call as a recovered it, and b's store.
func restartedAndHandedOn(t *testing.T) (a *Store, recovered store.Call, b *Store, m *Member) {
	t.Helper()
	m = startMember(t, t.TempDir())
	ctx := context.Background()
	old := openStore(t, m, Options{Node: "a"})
	lease := nodeLease(t, old, old.Prefix()+"nodes/a")
	now := time.Now().UTC()
	for _, c := range []store.Call{
		{ID: "call_1", ProjectID: "p", TeamID: "acme", State: store.CallRunning, Attempt: 1, Created: now, Dispatched: now, ReplicaID: "r1"},
		{ID: "call_mine", ProjectID: "p", TeamID: "acme", State: store.CallQueued, Created: now},
	} {
		if err := old.SaveCall(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := old.Client().Revoke(ctx, lease); err != nil {
		t.Fatal(err)
	}
	old.Close()

	a = leasedNode(t, m, "a")
	pending, err := a.PendingCalls()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range pending {
		if c.ID == "call_1" {
			recovered = c
		}
	}
	if recovered.ID == "" {
		t.Fatalf("PendingCalls of the restarted node = %v, want call_1", pending)
	}

	lead := openStore(t, m, Options{Node: "lead"})
	t.Cleanup(func() { lead.Close() })
	at := callsOf(t, lead, "a")["call_1"]
	if err := lead.HandOver(leaderFence(t, lead), at.Call, at.Rev, "b"); err != nil {
		t.Fatal(err)
	}
	b = leasedNode(t, m, "b")
	return a, recovered, b, m
}

// A node restarted quickly recovers a call the leader then hands to
// another node: its write of the call (recovery's requeue) is refused,
// though its new lease is valid, and the handed-over record stands.
func TestRecoveredCallHandedOnIsNotWrittenHere(t *testing.T) {
	a, c, _, _ := restartedAndHandedOn(t)
	c.State, c.ReplicaID, c.Dispatched = store.CallQueued, "", time.Time{}
	err := a.SaveCall(context.Background(), c)
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("the restarted node's write of a call handed on = %v, want ErrFenced", err)
	}
	if node, err := a.CallNode("call_1"); err != nil || node != "b" {
		t.Errorf("call_1 is pending on %q (%v), want b, as the leader handed it", node, err)
	}
	// Its other recovered call is still its own.
	if err := a.SaveCall(context.Background(), store.Call{ID: "call_mine", ProjectID: "p", TeamID: "acme", State: store.CallRunning}); err != nil {
		t.Errorf("the restarted node's write of its own recovered call = %v", err)
	}
}

// A call finished by the node it was handed to: a late write of it from
// the node that recovered it, running or final, is refused, and the other
// node's result stands.
func TestCallFinishedElsewhereRefusesALateWrite(t *testing.T) {
	a, c, b, _ := restartedAndHandedOn(t)
	ctx := context.Background()
	handed, err := b.Adopt("call_1")
	if err != nil {
		t.Fatal(err)
	}
	handed.State, handed.Message, handed.Outputs = store.CallSucceeded, "success", []byte(`{"y":2}`)
	handed.Finished = time.Now().UTC()
	if err := b.SaveCall(ctx, handed); err != nil {
		t.Fatalf("node b's result = %v", err)
	}
	late := c
	late.State, late.Message, late.Finished = store.CallFailed, "interrupted", time.Now().UTC()
	if err := a.SaveCall(ctx, late); !errors.Is(err, store.ErrFenced) {
		t.Errorf("node a's late final write = %v, want ErrFenced", err)
	}
	if err := a.SaveCall(ctx, c); !errors.Is(err, store.ErrFenced) {
		t.Errorf("node a's late running write = %v, want ErrFenced", err)
	}
	got, err := a.GetCallResult("call_1")
	if err != nil || got.State != store.CallSucceeded || string(got.Outputs) != `{"y":2}` {
		t.Errorf("call_1 = %+v, %v; want node b's result", got, err)
	}
}

// A call this node creates is written only if its id is new: a creation
// of an id another node holds, queued or final, is refused, and the other
// node's record stands.
func TestCreationOfAnExistingCallIsRefused(t *testing.T) {
	m := startMember(t, t.TempDir())
	a, b := leasedNode(t, m, "a"), leasedNode(t, m, "b")
	ctx := context.Background()
	now := time.Now().UTC()
	theirs := []store.Call{
		{ID: "call_q", TeamID: "b-team", State: store.CallQueued, Created: now},
		{ID: "call_done", TeamID: "b-team", State: store.CallSucceeded, Message: "success", Created: now, Finished: now},
	}
	for _, c := range theirs {
		if err := b.SaveCall(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []store.Call{
		{ID: "call_q", TeamID: "a-team", State: store.CallQueued, Created: now},
		// A sync start's one write: final and a creation.
		{ID: "call_done", TeamID: "a-team", State: store.CallFailed, Message: "no", Created: now, Finished: now},
	} {
		if err := a.SaveCall(ctx, c); !errors.Is(err, store.ErrFenced) {
			t.Errorf("node a creating %s, which node b holds = %v, want ErrFenced", c.ID, err)
		}
	}
	for _, want := range theirs {
		if got, err := a.GetCall(want.ID); err != nil || got.TeamID != "b-team" || got.State != want.State {
			t.Errorf("%s = %+v, %v; want node b's record", want.ID, got, err)
		}
	}
	if node, err := a.CallNode("call_q"); err != nil || node != "b" {
		t.Errorf("call_q pending on %q (%v), want b", node, err)
	}
}

// The life of a call under the fences commits every write: created,
// running and final, also when its creation and its next write share a
// batch, a recovered call's writes, and those of a call first written
// before the node's first lease.
func TestCallLifeUnderFencesCommits(t *testing.T) {
	m := startMember(t, t.TempDir())
	a := leasedNode(t, m, "a")
	ctx := context.Background()
	now := time.Now().UTC()
	life := func(id string) []store.Call {
		return []store.Call{
			{ID: id, TeamID: "acme", State: store.CallQueued, Created: now},
			{ID: id, TeamID: "acme", State: store.CallRunning, Created: now, Dispatched: now},
			{ID: id, TeamID: "acme", State: store.CallSucceeded, Message: "success", Created: now, Dispatched: now, Finished: now},
		}
	}
	for _, c := range life("call_1") {
		if err := a.SaveCall(ctx, c); err != nil {
			t.Fatalf("%s write of call_1 = %v", c.State, err)
		}
	}

	// Created and running in one batch, then final.
	l := life("call_2")
	var batch []callWrite
	for _, c := range l[:2] {
		cw, err := a.newCallWrite(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, cw)
	}
	if fenced, err := a.w.commit(batch); err != nil || len(fenced) != 0 {
		t.Fatalf("creation and running in one batch: fenced %v, %v", fenced, err)
	}
	if err := a.SaveCall(ctx, l[2]); err != nil {
		t.Fatalf("final write after a batched creation = %v", err)
	}

	// Queued here, then recovered by the node's next process.
	l = life("call_3")
	if err := a.SaveCall(ctx, l[0]); err != nil {
		t.Fatal(err)
	}
	next := leasedNode(t, m, "a")
	if _, err := next.PendingCalls(); err != nil {
		t.Fatal(err)
	}
	for _, c := range l[1:] {
		if err := next.SaveCall(ctx, c); err != nil {
			t.Fatalf("recovered call's %s write = %v", c.State, err)
		}
	}
	// Queued before the node's first lease, then written under it.
	l = life("call_4")
	early := openStore(t, m, Options{Node: "a"})
	defer early.Close()
	if err := early.SaveCall(ctx, l[0]); err != nil {
		t.Fatal(err)
	}
	nodeLease(t, early, early.Prefix()+"nodes/a")
	for _, c := range l[1:] {
		if err := early.SaveCall(ctx, c); err != nil {
			t.Fatalf("%s write under the first lease of a call written before it = %v", c.State, err)
		}
	}
	for _, id := range []string{"call_1", "call_2", "call_3", "call_4"} {
		if c, err := a.GetCall(id); err != nil || c.State != store.CallSucceeded {
			t.Errorf("%s = %+v, %v; want succeeded", id, c, err)
		}
		if node, err := a.CallNode(id); err != nil || node != "" {
			t.Errorf("%s still pending on %q (%v)", id, node, err)
		}
	}
}

// One batch holding a write of a call handed on, a creation of an id that
// exists, a new call and a write of a call still this node's: the two
// fenced writes are refused, each with its reason, and the others commit.
func TestBatchMixingFencedAndGoodWritesCommitsTheGood(t *testing.T) {
	a, handed, b, _ := restartedAndHandedOn(t)
	ctx := context.Background()
	if err := b.SaveCall(ctx, store.Call{ID: "call_dup", TeamID: "b-team", State: store.CallQueued}); err != nil {
		t.Fatal(err)
	}
	handed.State = store.CallSucceeded
	writes := []store.Call{
		handed,
		{ID: "call_dup", TeamID: "a-team", State: store.CallQueued},
		{ID: "call_new", TeamID: "acme", State: store.CallQueued},
		{ID: "call_mine", ProjectID: "p", TeamID: "acme", State: store.CallRunning},
	}
	var batch []callWrite
	for _, c := range writes {
		cw, err := a.newCallWrite(c, nil)
		if err != nil {
			t.Fatal(err)
		}
		batch = append(batch, cw)
	}
	fenced, err := a.w.commit(batch)
	if err != nil {
		t.Fatal(err)
	}
	if len(fenced) != 2 || !errors.Is(fenced["call_1"], store.ErrFenced) || !errors.Is(fenced["call_dup"], store.ErrFenced) {
		t.Fatalf("fenced = %v, want call_1 and call_dup", fenced)
	}
	t.Logf("reasons: %v; %v", fenced["call_1"], fenced["call_dup"])
	for id, want := range map[string]store.CallState{"call_1": store.CallQueued, "call_dup": store.CallQueued,
		"call_new": store.CallQueued, "call_mine": store.CallRunning} {
		if c, err := a.GetCall(id); err != nil || c.State != want {
			t.Errorf("%s = %+v, %v; want %s", id, c, err, want)
		}
	}
	if c, _ := a.GetCall("call_dup"); c.TeamID != "b-team" {
		t.Errorf("call_dup = %+v, want node b's record", c)
	}
	if node, _ := a.CallNode("call_1"); node != "b" {
		t.Errorf("call_1 pending on %q, want b", node)
	}
}

// A commit retried after a try etcd applied (its answer lost) finds its
// fence compares failing on its own write, a creation's record there or a
// final write's pending entry gone: finding the record as it writes it,
// it counts as committed and tells its webhook delivery. Without a retry,
// or finding another writer's record, the same failure is fenced.
func TestRetriedFencedCommitFindingItsOwnWriteCommitted(t *testing.T) {
	m := startMember(t, t.TempDir())
	a, b := leasedNode(t, m, "a"), leasedNode(t, m, "b")
	ctx := context.Background()
	once := func(cw callWrite, tries int) ([]store.Delivery, error) {
		t.Helper()
		batch := []callWrite{cw}
		fenced, err := a.w.commitAfter(batch, tries)
		if err != nil {
			t.Fatal(err)
		}
		return batch[0].queued, fenced[cw.id]
	}

	// A creation (a sync start's final write) applied, then retried.
	created, err := a.newCallWrite(finishedWithWebhook("call_sync", time.Now()), nil)
	if err != nil {
		t.Fatal(err)
	}
	if q, err := once(created, 0); err != nil || len(q) != 1 {
		t.Fatalf("first try: %v, queued %v", err, q)
	}
	a.fence.calls["call_sync"] = callFence{binding: created.fence} // its answer lost: not marked as written
	if q, err := once(created, 1); err != nil || len(q) != 1 {
		t.Errorf("retry of an applied creation: %v, queued %v; want committed with its delivery", err, q)
	}

	// A final write of a call already stored here, applied, then retried.
	if err := a.SaveCall(ctx, store.Call{ID: "call_run", TeamID: "acme", State: store.CallRunning}); err != nil {
		t.Fatal(err)
	}
	final, err := a.newCallWrite(finishedWithWebhook("call_run", time.Now()), nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := once(final, 0); err != nil {
		t.Fatalf("final write: %v", err)
	}
	if q, err := once(final, 1); err != nil || len(q) != 1 {
		t.Errorf("retry of an applied final write: %v, queued %v; want committed with its delivery", err, q)
	}
	if _, err := once(final, 0); !errors.Is(err, store.ErrFenced) {
		t.Errorf("the same write sent again, not a retry: %v, want ErrFenced (the call is final)", err)
	}

	// A retried creation that finds another node's record is fenced.
	if err := b.SaveCall(ctx, store.Call{ID: "call_b", TeamID: "b-team", State: store.CallQueued}); err != nil {
		t.Fatal(err)
	}
	mine, err := a.newCallWrite(store.Call{ID: "call_b", TeamID: "a-team", State: store.CallQueued}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := once(mine, 1); !errors.Is(err, store.ErrFenced) {
		t.Errorf("retried creation finding node b's record: %v, want ErrFenced", err)
	}
}
