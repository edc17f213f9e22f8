package etcd

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
	"inferd/store/storetest"
)

// nodeLease puts the node's key under a new lease, as a cluster node does
// at each session, binds the store's writes to it and returns it.
func nodeLease(t *testing.T, s *Store, key string) clientv3.LeaseID {
	t.Helper()
	ctx := context.Background()
	l, err := s.Client().Grant(ctx, 60)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().Put(ctx, key, "node", clientv3.WithLease(l.ID)); err != nil {
		t.Fatal(err)
	}
	s.BindLease(key, l.ID)
	return l.ID
}

// cutOffAndBack returns node a's store after c was written under a lease
// that then went (revoked, as a cut-off node's lapses) and the node
// rejoined under a new lease.
func cutOffAndBack(t *testing.T, opts Options, c store.Call) *Store {
	t.Helper()
	m := startMember(t, t.TempDir())
	opts.Node = "a"
	s := openStore(t, m, opts)
	t.Cleanup(func() { s.Close() })
	ctx := context.Background()
	key := s.Prefix() + "nodes/a"
	old := nodeLease(t, s, key)
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().Revoke(ctx, old); err != nil {
		t.Fatal(err)
	}
	nodeLease(t, s, key)
	return s
}

// A node cut off long enough for its lease to go (revoked here) cannot
// write the calls it held under that lease, even after it rejoined under a
// new one; its new calls commit, in the same transaction as the refused
// write, and the refused write queues none of its webhook messages.
func TestWriteUnderALapsedLeaseIsFencedWhileTheBatchCommits(t *testing.T) {
	s := cutOffAndBack(t, Options{}, store.Call{ID: "call_old", TeamID: "acme", State: store.CallQueued})
	ctx := context.Background()

	// One batch: the old call's late result, a new call, and an unfenced
	// write (a call written before any lease, as on a single box).
	late, err := s.newCallWrite(finishedWithWebhook("call_old", time.Now()), nil)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := s.newCallWrite(store.Call{ID: "call_new", TeamID: "acme", State: store.CallQueued}, nil)
	if err != nil {
		t.Fatal(err)
	}
	plain := fresh
	plain.id, plain.fence = "call_plain", binding{}
	plain.ops, _, _, err = s.callOps(store.Call{ID: "call_plain", TeamID: "acme", State: store.CallQueued})
	if err != nil {
		t.Fatal(err)
	}
	batch := []callWrite{late, fresh, plain}
	fenced, err := s.w.commit(batch)
	if err != nil {
		t.Fatal(err)
	}
	if fenced["call_old"] == nil || fenced["call_new"] != nil || fenced["call_plain"] != nil {
		t.Errorf("fenced = %v, want call_old only", fenced)
	}
	if len(batch[0].queued) != 0 {
		t.Errorf("the fenced write queued %v, want no webhook message", batch[0].queued)
	}
	if got := storetest.PendingDeliveryIDs(t, s); len(got) != 0 {
		t.Errorf("outbox holds %v after a fenced write, want nothing", got)
	}
	if c, err := s.GetCall("call_old"); err != nil || c.State != store.CallQueued {
		t.Errorf("call_old = %+v, %v; want it as it was, queued", c, err)
	}
	for _, id := range []string{"call_new", "call_plain"} {
		if c, err := s.GetCall(id); err != nil || c.State != store.CallQueued {
			t.Errorf("%s = %+v, %v; want it committed beside the fenced write", id, c, err)
		}
	}

	// Through the public path: the writer ends the write with ErrFenced.
	err = s.SaveCall(ctx, store.Call{ID: "call_old", TeamID: "acme", State: store.CallFailed, Message: "late"})
	if !errors.Is(err, store.ErrFenced) {
		t.Errorf("SaveCall of a call taken under the lapsed lease = %v, want ErrFenced", err)
	}
	// The new call is bound to the new lease: its writes go on.
	if err := s.SaveCall(ctx, store.Call{ID: "call_new", TeamID: "acme", State: store.CallSucceeded, Message: "success"}); err != nil {
		t.Errorf("SaveCall of a call taken under the current lease = %v", err)
	}
}

// A call handed back to this node (the leader rewrote its pending entry to
// name it) is adopted under the node's current lease: its writes commit
// again, though it was taken under a lease that lapsed.
func TestAdoptBindsTheCallToTheCurrentLease(t *testing.T) {
	in := []byte(`{"x":1}`)
	s := cutOffAndBack(t, Options{}, store.Call{ID: "call_1", TeamID: "acme", State: store.CallQueued, Inputs: in})
	ctx := context.Background()
	if err := s.SaveCall(ctx, store.Call{ID: "call_1", TeamID: "acme", State: store.CallRunning}); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("write before Adopt = %v, want ErrFenced", err)
	}
	c, err := s.Adopt("call_1")
	if err != nil {
		t.Fatal(err)
	}
	if c.State != store.CallQueued || c.InputBytes != int64(len(in)) {
		t.Errorf("Adopt = %+v; want the queued call with its inputs' size", c)
	}
	c.State = store.CallSucceeded
	if err := s.SaveCall(ctx, c); err != nil {
		t.Errorf("write after Adopt = %v, want it committed", err)
	}
}

// Adopt refuses a call that is not pending on this node: handed on to
// another node meanwhile, final, or gone; CallNode names the node a call
// is pending on.
func TestAdoptRefusesACallNotPendingHere(t *testing.T) {
	m := startMember(t, t.TempDir())
	a := openStore(t, m, Options{Node: "a"})
	defer a.Close()
	b := openStore(t, m, Options{Node: "b"})
	defer b.Close()
	ctx := context.Background()
	for _, c := range []store.Call{
		{ID: "call_b", State: store.CallQueued},
		{ID: "call_done", State: store.CallSucceeded, Message: "success"},
	} {
		if err := b.SaveCall(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	for _, id := range []string{"call_b", "call_done", "call_none"} {
		if _, err := a.Adopt(id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("node a Adopt(%s) = %v, want ErrNotFound", id, err)
		}
	}
	// Any node tells which node a call is pending on; none once final.
	for id, want := range map[string]string{"call_b": "b", "call_done": "", "call_none": ""} {
		if got, err := a.CallNode(id); err != nil || got != want {
			t.Errorf("CallNode(%s) = %q, %v; want %q", id, got, err, want)
		}
	}
}

// A full batch of fenced final calls, each with an idempotency key and a
// webhook (the most operations a call write has, nested twice), stays
// within etcd's 128 operations per transaction and at every nested level.
func TestFullBatchOfFencedCallsFitsOneTransaction(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{Node: "a"})
	defer s.Close()
	nodeLease(t, s, s.Prefix()+"nodes/a")
	const n = 100
	var wg sync.WaitGroup
	wg.Add(n)
	for i := range n {
		c := finishedWithWebhook(fmt.Sprintf("call_%03d", i), time.Now())
		c.IdempotencyKey, c.Inputs = fmt.Sprintf("k%d", i), []byte(`{}`)
		c.WebhookEvents = []string{store.EventStart, store.EventCompleted}
		s.SaveCallAsync(c, func(err error) {
			if err != nil {
				t.Error(err)
			}
			wg.Done()
		})
	}
	wg.Wait()
}

// Payloads held on nodes go with their call's write: a fenced write names
// none of its held outputs in etcd, while a call of the new lease has its
// held inputs named.
func TestFencedWriteNamesNoHeldPayload(t *testing.T) {
	big := jsonOf(InlineLimit+1, "b")
	s := cutOffAndBack(t, Options{Payloads: newFakePayloads()}, store.Call{ID: "call_old", State: store.CallRunning})
	ctx := context.Background()
	err := s.SaveCall(ctx, store.Call{ID: "call_old", State: store.CallSucceeded, Message: "success", Outputs: big})
	if !errors.Is(err, store.ErrFenced) {
		t.Fatalf("late result with held outputs = %v, want ErrFenced", err)
	}
	if _, ok, err := s.HeldPayload("call_old", KindOutputs); err != nil || ok {
		t.Errorf("the fenced write's outputs are named in etcd (%v, %v)", ok, err)
	}
	if err := s.SaveCall(ctx, store.Call{ID: "call_new", State: store.CallQueued, Inputs: big}); err != nil {
		t.Fatal(err)
	}
	if in, err := s.CallInputs("call_new"); err != nil || !bytes.Equal(in, big) {
		t.Errorf("CallInputs of the new lease's call = %d bytes, %v; want its held inputs", len(in), err)
	}
}
