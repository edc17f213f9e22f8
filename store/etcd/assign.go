package etcd

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// The leader's writes (package cluster): moving the calls of a lost node to
// live ones. Every write here is one transaction that compares the leader's
// election key (Fence) and the call's revision as read, so a deposed leader
// (two nodes may both believe they lead for about 0.6 s after a cut) and a
// leader working from a stale read change nothing.

// Fence is a leader's election key and its CreateRevision
// (concurrency.Election's Key and Rev): a leader write applies only while
// that key still exists with that revision.
type Fence struct {
	Key string
	Rev int64
}

func (f Fence) cmp() clientv3.Cmp {
	return clientv3.Compare(clientv3.CreateRevision(f.Key), "=", f.Rev)
}

// ErrNotLeader is a leader write refused because its Fence no longer holds:
// another node leads now. The writer must stop leading.
var ErrNotLeader = errors.New("no longer the cluster leader")

// ErrCallChanged is a leader write refused because the call changed since
// it was read (its node wrote it meanwhile, or it was handed on already):
// the leader reads it again.
var ErrCallChanged = errors.New("the call changed since it was read")

// CallAt is a pending call with the ModRevision of its calls/<id> record as
// read, for HandOver and FailLost to compare.
type CallAt struct {
	Call store.Call
	Rev  int64
}

// CallsOfNode returns the pending calls whose pending/<id> entry names node
// (the calls it runs or holds queued), each with its record's revision,
// read at one revision. Inputs are left out (InputBytes says their size).
// A call whose record does not decode is left out: the leader cannot hand
// it on, and must not be stopped from handing on the others.
func (s *Store) CallsOfNode(node string) ([]CallAt, error) {
	return s.callsPendingOn(fmt.Sprintf("calls of node %s", node), node, true)
}

// NodesWithCalls returns the names of the nodes that pending calls name
// (each once, sorted): a new leader checks that each is alive.
func (s *Store) NodesWithCalls() ([]string, error) {
	const what = "nodes with calls"
	if err := s.check(what); err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.rangeOf(ctx, s.key("pending")+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(what, err)
	}
	var out []string
	for _, kv := range resp.Kvs {
		out = append(out, string(kv.Value))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// HandOver gives call c (read at revision rev, see CallsOfNode) to node
// to: the call is written queued, with the Attempt given (the leader
// decides whether an interrupted run counts), pending/<id> names to, and
// assign/<to>/<id> tells that node to adopt it (package cluster). The
// call's inputs stay as stored. It is one transaction, fenced on f and on
// the call's revision: ErrNotLeader or ErrCallChanged when either moved.
func (s *Store) HandOver(f Fence, c store.Call, rev int64, to string) error {
	what := fmt.Sprintf("hand call %s over to node %s", c.ID, to)
	c.State, c.ReplicaID, c.Message = store.CallQueued, "", ""
	c.Dispatched, c.Finished = time.Time{}, time.Time{}
	c.QueueMs, c.BootMs, c.RunMs = 0, 0, 0
	ops, err := s.leaderCallOps(what, c, to)
	if err != nil {
		return err
	}
	ops = append(ops, clientv3.OpPut(s.key("assign", to, c.ID), ""))
	_, _, err = s.leaderTxn(what, f, c.ID, rev, ops, nil)
	return err
}

// FailLost makes call c (read at revision rev) final as failed with
// message msg: its finished/ index and its webhook deliveries are written
// as by any final write, and the deliveries are this node's to send (the
// leader's deliverer hears of them). Fenced as HandOver is.
func (s *Store) FailLost(f Fence, c store.Call, rev int64, msg string) error {
	what := fmt.Sprintf("fail lost call %s", c.ID)
	c.State, c.Message, c.Outputs = store.CallFailed, msg, nil
	c.Failure = &store.Failure{Kind: store.FailInterrupted} // its node was lost
	c.Finished = s.now().UTC()
	ops, err := s.leaderCallOps(what, c, "")
	if err != nil {
		return err
	}
	ds := store.DeliveriesFor(c, s.now().UTC())
	records, err := s.deliveryRecords(what, ds)
	if err != nil {
		return err
	}
	first := len(ops)
	var checks []clientv3.Op // each delivery's outbox record, read when an applied try is found
	for i, d := range ds {
		ops = append(ops, s.queueOp(d.ID, records[i]))
		checks = append(checks, clientv3.OpGet(s.key("outbox", d.ID)))
	}
	resp, own, err := s.leaderTxn(what, f, c.ID, rev, ops, checks)
	if err != nil {
		return err
	}
	var queued []store.Delivery
	for i, d := range ds {
		if own && foundValue(resp.Responses[2+i], records[i]) || !own && queuedNow(resp.Responses[first+i], records[i]) {
			queued = append(queued, d)
		}
	}
	s.deliveryHooks.Notify(queued)
	return nil
}

// HandOverDeliveries gives the webhook deliveries not ended that node from
// queued (a lost node's) to node to, whose store tells its deliverer of
// them (watchHandedDeliveries). Each record is rewritten only if unchanged
// since read, fenced on f; it returns how many moved.
func (s *Store) HandOverDeliveries(f Fence, from, to string) (int, error) {
	what := fmt.Sprintf("hand deliveries of node %s over to node %s", from, to)
	if err := s.check(what); err != nil {
		return 0, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.rangeOf(ctx, s.key("outbox")+"/", clientv3.WithPrefix())
	if err != nil {
		return 0, s.wrap(what, err)
	}
	n := 0
	for _, kv := range resp.Kvs {
		rec, err := decode[outboxRecord](what, string(kv.Key), kv.Value)
		if err != nil {
			// Not one the leader can tell the node of, nor send: skipped,
			// so that one damaged record (a broken node's) does not stop
			// every lost node's webhooks and calls from being handed on.
			continue
		}
		if rec.Node != from {
			continue
		}
		rec.Node, rec.Write = to, ""
		v, err := encode(what, rec)
		if err != nil {
			return n, err
		}
		// Sent again when a leader change lost its answer: a try that
		// was applied is found by its value (the record naming to).
		tr, resent, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
			return s.cli.Txn(ctx).
				If(f.cmp(), clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision)).
				Then(clientv3.OpPut(string(kv.Key), v)).
				Else(clientv3.OpGet(f.Key), clientv3.OpGet(string(kv.Key)))
		})
		if err != nil {
			return n, s.wrap(what, err)
		}
		if !tr.Succeeded {
			if !fenceHeld(f, tr) {
				return n, fmt.Errorf("%s: %w", what, ErrNotLeader)
			}
			if !resent || !foundValue(tr.Responses[1], v) {
				continue // ended or attempted meanwhile: its sender still lives
			}
		}
		n++
	}
	return n, nil
}

// leaderCallOps is callOps with pending/<id> naming node (the call's new
// node) instead of this one, and "" for a final call (which has no entry).
func (s *Store) leaderCallOps(what string, c store.Call, node string) ([]clientv3.Op, error) {
	ops, _, err := s.callOps(c)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if c.State.Done() {
		return ops, nil
	}
	pending := s.key("pending", c.ID)
	for i, op := range ops {
		if op.IsPut() && string(op.KeyBytes()) == pending {
			ops[i] = clientv3.OpPut(pending, node)
		}
	}
	return ops, nil
}

// leaderTxn commits ops, which put calls/<id>, if f holds and calls/<id>
// is at rev; it tells which compare failed.
//
// It is sent again when a leader change lost its answer (retry.go). A try
// that was applied makes the next one's call compare fail; the Else then
// finds calls/<id> holding this write's record (its stamps make it this
// write's own) under a fence still held: the write was applied, own is
// true, and resp is the Else's: a get of f.Key, of calls/<id>, then checks
// (gets by which the caller tells what the applied try did).
func (s *Store) leaderTxn(what string, f Fence, id string, rev int64, ops, checks []clientv3.Op) (resp *clientv3.TxnResponse, own bool, err error) {
	if err := s.check(what); err != nil {
		return nil, false, err
	}
	ck := s.key("calls", id)
	var record string
	for _, op := range ops {
		if op.IsPut() && string(op.KeyBytes()) == ck {
			record = string(op.ValueBytes())
		}
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, resent, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return s.cli.Txn(ctx).
			If(f.cmp(), clientv3.Compare(clientv3.ModRevision(ck), "=", rev)).
			Then(ops...).
			Else(append([]clientv3.Op{clientv3.OpGet(f.Key), clientv3.OpGet(ck)}, checks...)...)
	})
	if err != nil {
		return nil, false, s.wrap(what, err)
	}
	if resp.Succeeded {
		return resp, false, nil
	}
	if !fenceHeld(f, resp) {
		return nil, false, fmt.Errorf("%s: %w", what, ErrNotLeader)
	}
	if resent && foundValue(resp.Responses[1], record) {
		return resp, true, nil
	}
	return nil, false, fmt.Errorf("%s: %w", what, ErrCallChanged)
}

// fenceHeld reads a failed leader transaction's Else (a get of f.Key):
// whether the election key still has the fence's revision, so the other
// compare was the one that failed.
func fenceHeld(f Fence, resp *clientv3.TxnResponse) bool {
	kvs := resp.Responses[0].GetResponseRange().Kvs
	return len(kvs) == 1 && kvs[0].CreateRevision == f.Rev
}

// handedDeliveries tells this store's delivery hooks of the outbox records
// another store rewrote to name this node (HandOverDeliveries, by the
// leader): this node's deliverer sends them from now on.
func (s *Store) handedDeliveries(ev *clientv3.Event) {
	if ev.Type != mvccpb.PUT || ev.PrevKv == nil {
		return // a new record is queued by a call write, whose own hooks run
	}
	if bytes.Equal(ev.Kv.Value, ev.PrevKv.Value) {
		return
	}
	var prev, cur outboxRecord
	if json.Unmarshal(ev.PrevKv.Value, &prev) != nil || json.Unmarshal(ev.Kv.Value, &cur) != nil {
		return // undecodable: PendingDeliveries reports it at the next start
	}
	if cur.Node == s.node && prev.Node != s.node {
		s.deliveryHooks.Notify([]store.Delivery{cur.Delivery})
	}
}

// resyncDelivery is handedDeliveries after a broken watch: the record of
// id is told again if it names this node (the deliverer ignores a
// delivery it already holds).
func (s *Store) resyncDelivery(id string) {
	k := s.key("outbox", id)
	raw, _, ok, err := s.get("resync delivery", k)
	if err != nil || !ok {
		return // gone (ended) or unreadable now: PendingDeliveries at the next start
	}
	var rec outboxRecord
	if json.Unmarshal(raw, &rec) == nil && rec.Node == s.node {
		s.deliveryHooks.Notify([]store.Delivery{rec.Delivery})
	}
}

// watchHandedDeliveries is the outbox watch of handedDeliveries, from
// revision from until Close.
func (s *Store) watchHandedDeliveries(from int64) {
	s.outboxWatch = keyWatch{dir: s.key("outbox") + "/", tell: s.handedDeliveries, resync: s.resyncDelivery}
	s.outboxWatch.start(s, from)
}
