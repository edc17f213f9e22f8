package etcd

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
	"inferd/store/storetest"
)

// finishedWithWebhook is a final call that makes its completed delivery due.
func finishedWithWebhook(id string, at time.Time) store.Call {
	return store.Call{ID: id, TeamID: "acme", State: store.CallSucceeded, Message: "success",
		Created: at, Dispatched: at, Finished: at, Webhook: "http://127.0.0.1:9/hook",
		WebhookEvents: []string{store.EventCompleted}}
}

// Each node's deliverer sends the messages of the calls that node wrote,
// as each node recovers its own pending calls: the hooks and the pending
// list of one node never hold another node's deliveries.
func TestPendingDeliveriesAreTheNodesOwn(t *testing.T) {
	m := startMember(t, t.TempDir())
	a := openStore(t, m, Options{Node: "a"})
	defer a.Close()
	b := openStore(t, m, Options{Node: "b"})
	defer b.Close()
	var mu sync.Mutex
	heard := map[string][]string{}
	for name, s := range map[string]*Store{"a": a, "b": b} {
		s.OnDeliveryQueued(func(d store.Delivery) {
			mu.Lock()
			heard[name] = append(heard[name], d.CallID)
			mu.Unlock()
		})
	}
	ctx := context.Background()
	now := time.Now()
	for _, w := range []struct {
		s  *Store
		id string
	}{{a, "call_a1"}, {b, "call_b1"}, {a, "call_a2"}} {
		if err := w.s.SaveCall(ctx, finishedWithWebhook(w.id, now)); err != nil {
			t.Fatal(err)
		}
	}
	want := map[string][]string{"a": {"call_a1", "call_a2"}, "b": {"call_b1"}}
	for name, s := range map[string]*Store{"a": a, "b": b} {
		ds, err := s.PendingDeliveries()
		if err != nil {
			t.Fatal(err)
		}
		var calls []string
		for _, d := range ds {
			calls = append(calls, d.CallID)
		}
		if !slices.Equal(calls, want[name]) {
			t.Errorf("node %s PendingDeliveries are of %v, want %v", name, calls, want[name])
		}
		mu.Lock()
		if !slices.Equal(heard[name], want[name]) {
			t.Errorf("node %s OnDeliveryQueued heard %v, want %v", name, heard[name], want[name])
		}
		mu.Unlock()
	}
	// An attempt recorded keeps the delivery with the node that queued it.
	ds, _ := a.PendingDeliveries()
	ds[0].Attempts, ds[0].NextAttempt = 1, now.Add(time.Minute)
	if err := a.UpdateDelivery(ds[0]); err != nil {
		t.Fatal(err)
	}
	if got := storetest.PendingDeliveryIDs(t, a); len(got) != 2 {
		t.Errorf("after an attempt node a has pending %v, want both of its deliveries", got)
	}
	if got := storetest.PendingDeliveryIDs(t, b); len(got) != 1 {
		t.Errorf("after node a's attempt node b has pending %v, want its one delivery", got)
	}
}

// A commit retried after a try that etcd applied but whose answer was lost
// finds its own outbox records there: its deliveries still count as queued
// by it, so the hooks hear of them. A later write of the same call, whose
// records are its own, queues nothing.
func TestRetriedCommitTellsItsDeliveries(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{})
	defer s.Close()
	c := finishedWithWebhook("call_1", time.Now())
	cw, err := s.newCallWrite(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	commit := func(cw callWrite) []store.Delivery {
		t.Helper()
		batch := []callWrite{cw}
		if _, err := s.w.commit(batch); err != nil {
			t.Fatal(err)
		}
		return batch[0].queued
	}
	if got := commit(cw); len(got) != 1 {
		t.Fatalf("first try queued %v, want the completed delivery", got)
	}
	if got := commit(cw); len(got) != 1 {
		t.Errorf("the retry of an applied try queued %v, want the completed delivery again", got)
	}
	again, err := s.newCallWrite(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if got := commit(again); len(got) != 0 {
		t.Errorf("a later write of the call queued %v, want nothing", got)
	}
	if got := storetest.PendingDeliveryIDs(t, s); len(got) != 1 {
		t.Errorf("pending %v, want one delivery", got)
	}
}

// The marks of ended deliveries go when ExpireCalls passes their end, with
// their calls; later ones stay.
func TestEndedDeliveryMarksExpire(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{})
	defer s.Close()
	ctx := context.Background()
	old, recent := time.Now().Add(-2*time.Hour), time.Now()
	for id, at := range map[string]time.Time{"call_old": old, "call_new": recent} {
		if err := s.SaveCall(ctx, finishedWithWebhook(id, at)); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := s.PendingDeliveries()
	if err != nil || len(ds) != 2 {
		t.Fatalf("PendingDeliveries = %v, %v; want 2", ds, err)
	}
	for _, d := range ds {
		d.Ended, d.Delivered = old, true
		if d.CallID == "call_new" {
			d.Ended = recent
		}
		if err := s.UpdateDelivery(d); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.ExpireCalls(time.Now().Add(-time.Hour)); err != nil || n != 1 {
		t.Fatalf("ExpireCalls = %d, %v; want 1", n, err)
	}
	resp, err := s.cli.Get(ctx, s.key("outboxended")+"/", clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		t.Fatal(err)
	}
	var marks []string
	for _, kv := range resp.Kvs {
		marks = append(marks, string(kv.Key))
	}
	if want := []string{s.key("outboxended", store.DeliveryID("call_new", store.EventCompleted))}; !slices.Equal(marks, want) {
		t.Errorf("ended marks after expiry %v, want %v", marks, want)
	}
}

// A webhook secret drawn or rotated through one node is the one every
// node signs with, at once (no cache).
func TestWebhookSecretRotatedThroughOneNodeIsSeenByAnother(t *testing.T) {
	n1, n2 := twoNodes(t)
	if _, err := n1.EnsureTeam("acme"); err != nil {
		t.Fatal(err)
	}
	first, err := n1.WebhookSecret("acme", false)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := n2.WebhookSecret("acme", false); err != nil || got != first {
		t.Fatalf("node 2 has another secret than node 1 drew (err %v)", err)
	}
	rotated, err := n2.WebhookSecret("acme", true)
	if err != nil {
		t.Fatal(err)
	}
	if got, _ := n1.WebhookSecret("acme", false); got != rotated {
		t.Errorf("node 1 still signs with the old secret after node 2 rotated it")
	}
}
