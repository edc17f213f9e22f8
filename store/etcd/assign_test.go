package etcd

import (
	"context"
	"errors"
	"maps"
	"slices"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// leaderFence puts an election key the way concurrency.Election does and
// returns the fence of it, standing for the leader's.
func leaderFence(t *testing.T, s *Store) Fence {
	t.Helper()
	k := s.key("election", "test-leader")
	resp, err := s.Client().Put(context.Background(), k, "leader")
	if err != nil {
		t.Fatal(err)
	}
	return Fence{Key: k, Rev: resp.Header.Revision}
}

// lostNodeStores opens the store of a node "lost" and of a leader "lead"
// over one member, and writes call_run (running, with a start and
// completed webhook) and call_q (queued) as node "lost".
func lostNodeStores(t *testing.T) (lost, lead *Store, m *Member) {
	t.Helper()
	m = startMember(t, t.TempDir())
	lost = openStore(t, m, Options{Node: "lost"})
	lead = openStore(t, m, Options{Node: "lead"})
	t.Cleanup(func() { lost.Close(); lead.Close() })
	now := time.Now().UTC()
	calls := []store.Call{
		{ID: "call_run", ProjectID: "p", TeamID: "acme", State: store.CallRunning, Attempt: 1,
			Created: now, Dispatched: now, ReplicaID: "r1", Inputs: []byte(`{"x":1}`),
			Webhook: "http://127.0.0.1:9/hook", WebhookEvents: []string{store.EventStart, store.EventCompleted}},
		{ID: "call_q", ProjectID: "p", TeamID: "acme", State: store.CallQueued, Created: now, Inputs: []byte(`{"x":2}`)},
	}
	for _, c := range calls {
		if err := lost.SaveCall(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	return lost, lead, m
}

// failLostSetup is lostNodeStores with the leader's fence, node lost's
// running call as read, and what the leader's delivery hooks hear.
func failLostSetup(t *testing.T) (lost, lead *Store, f Fence, run CallAt, heard chan store.Delivery) {
	t.Helper()
	lost, lead, _ = lostNodeStores(t)
	heard = make(chan store.Delivery, 4)
	lead.OnDeliveryQueued(func(d store.Delivery) { heard <- d })
	f = leaderFence(t, lead)
	return lost, lead, f, callsOf(t, lead, "lost")["call_run"], heard
}

// waitCompletedHeard waits for the leader's delivery hooks to hear of
// call_run's completed delivery (FailLost queued it).
func waitCompletedHeard(t *testing.T, heard <-chan store.Delivery) {
	t.Helper()
	select {
	case d := <-heard:
		if d.CallID != "call_run" || d.Event != store.EventCompleted {
			t.Errorf("leader's hooks heard of %+v, want call_run's completed", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("leader's hooks did not hear of the completed delivery")
	}
}

func callsOf(t *testing.T, s *Store, node string) map[string]CallAt {
	t.Helper()
	cs, err := s.CallsOfNode(node)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]CallAt{}
	for _, c := range cs {
		out[c.Call.ID] = c
	}
	return out
}

// The leader hands a lost node's call to a live one: queued, pending there
// (the node's PendingCalls has it), an assign/ key for it, inputs kept.
func TestHandOverMovesACallToAnotherNode(t *testing.T) {
	_, lead, m := lostNodeStores(t)
	f := leaderFence(t, lead)
	got := callsOf(t, lead, "lost")
	if len(got) != 2 {
		t.Fatalf("CallsOfNode(lost) = %v, want call_run and call_q", got)
	}
	if nodes, err := lead.NodesWithCalls(); err != nil || !slices.Equal(nodes, []string{"lost"}) {
		t.Errorf("NodesWithCalls = %v, %v; want [lost]", nodes, err)
	}
	run := got["call_run"]
	if run.Call.State != store.CallRunning || run.Rev == 0 || run.Call.InputBytes != int64(len(`{"x":1}`)) {
		t.Fatalf("call_run as read = %+v", run)
	}
	if err := lead.HandOver(f, run.Call, run.Rev, "live"); err != nil {
		t.Fatal(err)
	}
	live := openStore(t, m, Options{Node: "live"})
	defer live.Close()
	pend, err := live.PendingCalls()
	if err != nil || len(pend) != 1 || pend[0].ID != "call_run" {
		t.Fatalf("node live PendingCalls = %+v, %v; want call_run", pend, err)
	}
	if c := pend[0]; c.State != store.CallQueued || c.Attempt != 1 || c.ReplicaID != "" || !c.Dispatched.IsZero() {
		t.Errorf("handed call = %+v; want queued, attempt 1 kept, no replica", c)
	}
	full, err := live.GetCall("call_run")
	if err != nil || string(full.Inputs) != `{"x":1}` {
		t.Errorf("handed call's inputs = %s, %v", full.Inputs, err)
	}
	resp, err := live.Client().Get(context.Background(), live.key("assign", "live", "call_run"))
	if err != nil || len(resp.Kvs) != 1 {
		t.Errorf("assign/live/call_run = %v, %v; want the key", resp, err)
	}
	if left := callsOf(t, lead, "lost"); len(left) != 1 {
		t.Errorf("node lost still holds %v, want call_q only", left)
	}
	if nodes, err := lead.NodesWithCalls(); err != nil || !slices.Equal(nodes, []string{"live", "lost"}) {
		t.Errorf("NodesWithCalls = %v, %v; want [live lost]", nodes, err)
	}
}

// A leader write is refused once the fence's key is gone (another node
// leads), and when the call changed since it was read; neither changes
// the call.
func TestHandOverIsFencedOnLeaderAndCallRevision(t *testing.T) {
	lost, lead, _ := lostNodeStores(t)
	f := leaderFence(t, lead)
	q := callsOf(t, lead, "lost")["call_q"]

	// The node writes the call after the leader read it.
	moved := q.Call
	moved.State, moved.Dispatched = store.CallRunning, time.Now()
	if err := lost.SaveCall(context.Background(), moved); err != nil {
		t.Fatal(err)
	}
	if err := lead.HandOver(f, q.Call, q.Rev, "live"); !errors.Is(err, ErrCallChanged) {
		t.Errorf("HandOver of a call changed since read = %v, want ErrCallChanged", err)
	}

	q = callsOf(t, lead, "lost")["call_q"]
	if _, err := lead.Client().Delete(context.Background(), f.Key); err != nil {
		t.Fatal(err)
	}
	if err := lead.HandOver(f, q.Call, q.Rev, "live"); !errors.Is(err, ErrNotLeader) {
		t.Errorf("HandOver by a deposed leader = %v, want ErrNotLeader", err)
	}
	if err := lead.FailLost(f, q.Call, q.Rev, "error: node lost was lost"); !errors.Is(err, ErrNotLeader) {
		t.Errorf("FailLost by a deposed leader = %v, want ErrNotLeader", err)
	}
	// A new election key under the same name is a new leadership: the old
	// fence still does not hold.
	if _, err := lead.Client().Put(context.Background(), f.Key, "other"); err != nil {
		t.Fatal(err)
	}
	if err := lead.HandOver(f, q.Call, q.Rev, "live"); !errors.Is(err, ErrNotLeader) {
		t.Errorf("HandOver under a re-created election key = %v, want ErrNotLeader", err)
	}
	if c, err := lost.GetCall("call_q"); err != nil || c.State != store.CallRunning {
		t.Errorf("call_q = %+v, %v; want it as node lost wrote it", c, err)
	}
	if got := callsOf(t, lead, "lost"); len(got) != 2 {
		t.Errorf("node lost holds %v, want both calls still", got)
	}
}

// A lost call made final is failed with the message, off the pending
// index, and its completed webhook is queued for the leader's deliverer.
func TestFailLostEndsTheCallAndQueuesItsWebhook(t *testing.T) {
	lost, lead, f, run, heard := failLostSetup(t)
	const msg = "error: node lost was lost"
	if err := lead.FailLost(f, run.Call, run.Rev, msg); err != nil {
		t.Fatal(err)
	}
	c, err := lost.GetCall("call_run")
	if err != nil || c.State != store.CallFailed || c.Message != msg || c.Finished.IsZero() {
		t.Fatalf("call_run = %+v, %v; want failed with %q", c, err, msg)
	}
	if left := callsOf(t, lead, "lost"); len(left) != 1 {
		t.Errorf("node lost holds %v, want call_q only", left)
	}
	// The start delivery was queued by node lost's running write (it is
	// HandOverDeliveries' to move): only completed is new, and the leader's.
	waitCompletedHeard(t, heard)
	ds, err := lead.PendingDeliveries()
	if err != nil || len(ds) != 1 || ds[0].Event != store.EventCompleted {
		t.Errorf("leader's pending deliveries = %+v, %v; want completed only", ds, err)
	}
	// The call expires as any final call.
	if n, err := lead.ExpireCalls(time.Now().Add(time.Hour)); err != nil || n != 1 {
		t.Errorf("ExpireCalls = %d, %v; want the failed call", n, err)
	}
}

// A lost node's undelivered webhooks move to a live node, whose deliverer
// hears of them through its outbox watch.
func TestHandOverDeliveriesTellsTheNewNode(t *testing.T) {
	_, lead, m := lostNodeStores(t)
	live := openStore(t, m, Options{Node: "live"})
	defer live.Close()
	heard := make(chan store.Delivery, 4)
	live.OnDeliveryQueued(func(d store.Delivery) { heard <- d })
	f := leaderFence(t, lead)
	// A damaged record (written by a broken node) is passed over, not an
	// end to the handover.
	if _, err := lead.Client().Put(context.Background(), lead.key("outbox", "dlv_damaged"), "{not json"); err != nil {
		t.Fatal(err)
	}
	n, err := lead.HandOverDeliveries(f, "lost", "live")
	if err != nil || n != 1 {
		t.Fatalf("HandOverDeliveries = %d, %v; want the start delivery of call_run", n, err)
	}
	select {
	case d := <-heard:
		if d.CallID != "call_run" || d.Event != store.EventStart {
			t.Errorf("node live heard of %+v", d)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("node live's hooks did not hear of the handed delivery")
	}
	if _, err := lead.Client().Delete(context.Background(), lead.key("outbox", "dlv_damaged")); err != nil {
		t.Fatal(err) // PendingDeliveries refuses it (a start-up's check)
	}
	if ds, err := live.PendingDeliveries(); err != nil || len(ds) != 1 {
		t.Errorf("node live PendingDeliveries = %+v, %v", ds, err)
	}
	if _, err := lead.Client().Delete(context.Background(), f.Key, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	if _, err := lead.HandOverDeliveries(f, "live", "lead"); !errors.Is(err, ErrNotLeader) {
		t.Errorf("HandOverDeliveries by a deposed leader = %v, want ErrNotLeader", err)
	}
}

// A call record that does not decode (a broken node's) does not stop the
// leader reading the lost node's other calls: it is left out.
func TestCallsOfNodeLeavesOutARecordThatDoesNotDecode(t *testing.T) {
	_, lead, _ := lostNodeStores(t)
	for k, v := range map[string]string{lead.key("calls", "call_bad"): "{not json", lead.key("pending", "call_bad"): "lost"} {
		if _, err := lead.Client().Put(context.Background(), k, v); err != nil {
			t.Fatal(err)
		}
	}
	got := slices.Sorted(maps.Keys(callsOf(t, lead, "lost")))
	if want := []string{"call_q", "call_run"}; !slices.Equal(got, want) {
		t.Errorf("CallsOfNode(lost) = %v, want %v", got, want)
	}
}
