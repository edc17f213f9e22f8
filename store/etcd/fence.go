package etcd

import (
	"context"
	"fmt"
	"strings"
	"sync"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// binding is the lease a call's writes are fenced on: the node's key and
// the lease that key was put under when the call became this node's. The
// zero binding fences nothing.
type binding struct {
	key   string
	lease clientv3.LeaseID
}

// fenced reports whether writes under b compare a lease.
func (b binding) fenced() bool { return b.lease != 0 }

// cmp is the compare a write under b makes: the node's key is still under
// the lease the call was taken under. A key that is gone compares as lease
// 0, so a node whose key expired fails it too.
func (b binding) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.LeaseValue(b.key), "=", b.lease)
}

// leases holds the lease this node's call writes are fenced on now, and
// each live call's fence. A call is bound at its first write (or its Adopt)
// to the lease current then, and keeps that binding until its final write
// has committed or been fenced: a new lease (the node rejoined after it was
// cut off) never applies to a call taken under an old one, so the late
// result of a call the leader handed on cannot be written.
//
// Calls written while no lease is bound (a single box, the CLI, a node
// before its first session) have no lease binding and their writes are
// plain.
type leases struct {
	mu      sync.Mutex
	current binding
	calls   map[string]callFence
}

// callFence is what a call's writes are fenced on: its lease binding, and
// whether the call exists as this node's. A call this process was handed
// (PendingCalls at start-up, Adopt) or has written exists: each write
// compares that its pending/<id> entry still names this node. Any other
// call is a creation: its writes compare that calls/<id> is absent, until
// one of them commits.
type callFence struct {
	binding
	exists bool
}

// BindLease fences this node's later call writes on lease: each call
// written from now on that has no binding yet is bound to (key, lease),
// key being the full etcd key (with the store's prefix) that the node
// keeps under its lease, nodes/<name> in cluster mode (package cluster).
// Calls bound to an earlier lease keep it, so their writes stay fenced on
// it; a call handed back to this node gets the new lease through Adopt.
// Lease 0 ends fencing for calls not bound yet.
func (s *Store) BindLease(key string, lease clientv3.LeaseID) {
	s.fence.mu.Lock()
	defer s.fence.mu.Unlock()
	s.fence.current = binding{key: key, lease: lease}
}

// bindingFor returns call id's binding, binding it to the current lease
// when it has none yet.
func (l *leases) bindingFor(id string) binding {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.calls[id]
	if f.fenced() {
		return f.binding
	}
	if !l.current.fenced() {
		return binding{}
	}
	if l.calls == nil {
		l.calls = map[string]callFence{}
	}
	f.binding = l.current
	l.calls[id] = f
	return f.binding
}

// rebind binds call id, which exists as this node's (handed here), to the
// current lease, whatever it was bound to.
func (l *leases) rebind(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.calls == nil {
		l.calls = map[string]callFence{}
	}
	l.calls[id] = callFence{binding: l.current, exists: true}
}

// handed marks the calls PendingCalls read as existing: recovered at
// start-up, before or after the first lease is bound.
func (l *leases) handed(ids []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.calls == nil {
		l.calls = map[string]callFence{}
	}
	for _, id := range ids {
		f := l.calls[id]
		f.exists = true
		l.calls[id] = f
	}
}

// existing reports whether call id exists as this node's: its writes
// compare its pending entry, not its absence.
func (l *leases) existing(id string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls[id].exists
}

// written marks call id as existing once a write of it under b committed,
// unless the call was bound again meanwhile (Adopt, which marks it too). A
// call written with no lease bound is marked too, so that its writes once
// a lease is bound compare its pending entry, not its absence.
func (l *leases) written(id string, b binding) {
	l.mu.Lock()
	defer l.mu.Unlock()
	f, ok := l.calls[id]
	if ok && f.binding != b {
		return
	}
	if l.calls == nil {
		l.calls = map[string]callFence{}
	}
	l.calls[id] = callFence{binding: b, exists: true}
}

// release forgets call id's fence once its final write has committed or
// was fenced, unless the call was bound again meanwhile (Adopt).
func (l *leases) release(id string, b binding) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f, ok := l.calls[id]; ok && f.binding == b {
		delete(l.calls, id)
	}
}

// fenceCmps are the compares of a write of call id under b: the node's key
// still under b's lease, and the call still this node's (its pending
// entry names this node) or, for a creation, absent. The pending entry
// compared is the one before the write: a final write deletes it.
func (s *Store) fenceCmps(id string, b binding, exists bool) []clientv3.Cmp {
	if exists {
		return []clientv3.Cmp{b.cmp(), clientv3.Compare(clientv3.Value(s.key("pending", id)), "=", s.node)}
	}
	return []clientv3.Cmp{b.cmp(), clientv3.Compare(clientv3.CreateRevision(s.key("calls", id)), "=", 0)}
}

// fenceReadsFirst is the index of the first delivery read in fenceReads.
const fenceReadsFirst = 3

// fenceReads are the reads of a fenced write's failure branch: the call's
// record, its pending entry and the node's key (fencedBecause reads them),
// then each of the write's webhook deliveries (a retried commit that finds
// its own record tells which it queued).
func (s *Store) fenceReads(id string, b binding, deliveries []string) []clientv3.Op {
	ops := []clientv3.Op{clientv3.OpGet(s.key("calls", id)), clientv3.OpGet(s.key("pending", id)), clientv3.OpGet(b.key)}
	for _, d := range deliveries {
		ops = append(ops, clientv3.OpGet(s.key("outbox", d)))
	}
	return ops
}

// fencedBecause is the error of call id's write whose fence compares
// failed, read from fenceReads' answers: which compare failed.
func (s *Store) fencedBecause(id string, b binding, exists bool, t *etcdserverpb.TxnResponse) error {
	node := t.Responses[2].GetResponseRange().Kvs
	if len(node) == 0 || clientv3.LeaseID(node[0].Lease) != b.lease {
		return fencedError(id, b)
	}
	if !exists {
		return fmt.Errorf("save call %s: the call exists already, not created by this node: %w", id, store.ErrFenced)
	}
	pending := t.Responses[1].GetResponseRange().Kvs
	if len(pending) == 0 {
		return fmt.Errorf("save call %s: the call is final already (written by another node): %w", id, store.ErrFenced)
	}
	return fmt.Errorf("save call %s: the call is pending on node %s now: %w", id, pending[0].Value, store.ErrFenced)
}

// fencedError is the error of a write whose lease compare failed.
func fencedError(id string, b binding) error {
	return fmt.Errorf("save call %s: lease %x of %s no longer held: %w", id, int64(b.lease), b.key, store.ErrFenced)
}

// Adopt reads call id, which the leader handed to this node (its pending
// entry names this node), and binds it to the lease current now, so that
// this node's writes of it are fenced on this node's lease of today, not
// on one it held when the call was last its own. It fails with an error
// wrapping store.ErrNotFound when the call is gone, final, or pending on
// another node (handed on again meanwhile).
func (s *Store) Adopt(id string) (store.Call, error) {
	what := fmt.Sprintf("adopt call %s", id)
	if err := s.check(what); err != nil {
		return store.Call{}, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	ck := s.key("calls", id)
	resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn { // reads: sent again after a lost answer
		return s.cli.Txn(ctx).Then(clientv3.OpGet(ck), clientv3.OpGet(s.key("inputsize", id)), clientv3.OpGet(s.key("pending", id)))
	})
	if err != nil {
		return store.Call{}, s.wrap(what, err)
	}
	kvs := resp.Responses[0].GetResponseRange().Kvs
	if len(kvs) == 0 {
		return store.Call{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	pending := resp.Responses[2].GetResponseRange().Kvs
	if len(pending) == 0 || string(pending[0].Value) != s.node {
		holder := "none (final)"
		if len(pending) > 0 {
			holder = strings.TrimSpace(string(pending[0].Value))
		}
		return store.Call{}, fmt.Errorf("%s: pending on %s, not on this node: %w", what, holder, store.ErrNotFound)
	}
	c, err := decode[store.Call](what, ck, kvs[0].Value)
	if err != nil {
		return store.Call{}, err
	}
	if err := withoutInputs(what, &c, resp.Responses[1]); err != nil {
		return store.Call{}, err
	}
	s.fence.rebind(id)
	return c, nil
}

// CallNode returns the node call id is pending on (its pending/<id> entry:
// the node that wrote it last, or the one the leader handed it to), or ""
// when the call is final or unknown. The API forwards a cancel of a call
// pending on another node there.
func (s *Store) CallNode(id string) (string, error) {
	what := fmt.Sprintf("node of call %s", id)
	if err := s.check(what); err != nil {
		return "", err
	}
	v, _, ok, err := s.get(what, s.key("pending", id))
	if err != nil || !ok {
		return "", err
	}
	return string(v), nil
}

// foundValue reports whether a read's answer is one key with value v.
func foundValue(r *etcdserverpb.ResponseOp, v string) bool {
	kvs := r.GetResponseRange().Kvs
	return len(kvs) == 1 && string(kvs[0].Value) == v
}
