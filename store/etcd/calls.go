package etcd

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// MaxInlinePayload is the most bytes of inputs, and of outputs, a call
// keeps in etcd when the store has no Options.Payloads, each in a key of its
// own (see doc.go). etcd refuses a request over about 1.5 MiB, and a call
// write may carry both, so 512 KiB each leaves room for the rest; larger
// payloads are refused. With Options.Payloads, those over InlineLimit are
// held on nodes instead (held.go).
const MaxInlinePayload = 512 << 10

// ErrPayloadTooLarge is the error of a call write whose inputs or outputs
// are over MaxInlinePayload in a store without Options.Payloads.
var ErrPayloadTooLarge = errors.New("call payload over the cluster mode's inline limit")

// recentExamineLimit bounds how many call records one RecentCalls examines.
const recentExamineLimit = 10000

// SaveCall implements store.Calls.
func (s *Store) SaveCall(ctx context.Context, c store.Call) error {
	return store.SaveCallAndWait(ctx, s, c)
}

// SaveCallAsync implements store.Calls. The write is refused up front (done
// runs before SaveCallAsync returns) for an invalid id, a payload over
// MaxInlinePayload in a store without Options.Payloads, and after Close.
// Payloads over InlineLimit in a store with Options.Payloads are put on
// nodes first, off the caller's goroutine; the write is queued at once, and
// commits (in its call's order) once they are held.
func (s *Store) SaveCallAsync(c store.Call, done func(error)) {
	c, done, ok := store.PrepareCallWrite(c, done, s.now)
	if !ok {
		return
	}
	cw, err := s.newCallWrite(c, done)
	if err != nil {
		done(err)
		return
	}
	if !s.w.enqueue(cw) {
		done(fmt.Errorf("save call %s: %w", c.ID, store.ErrClosed))
		return
	}
	if cw.held != nil {
		s.hold(cw.held)
	}
}

// newCallWrite encodes the write of c (prepared by store.PrepareCallWrite)
// for the writer: the call with its indexes, and the webhook deliveries it
// makes due. Without Options.Payloads it refuses payloads over
// MaxInlinePayload; with it, those over InlineLimit are left to hold (its
// held is set, not yet started).
func (s *Store) newCallWrite(c store.Call, done func(error)) (callWrite, error) {
	what := fmt.Sprintf("save call %s", c.ID)
	for name, b := range map[string][]byte{KindInputs: c.Inputs, KindOutputs: c.Outputs} {
		if s.payloads == nil && len(b) > MaxInlinePayload {
			return callWrite{}, fmt.Errorf("%s: %s are %d bytes, over %d: %w", what, name, len(b), MaxInlinePayload, ErrPayloadTooLarge)
		}
	}
	ops, size, err := s.callOps(c)
	if err != nil {
		return callWrite{}, err
	}
	cw := callWrite{id: c.ID, ops: ops, size: size, done: done, deliveries: store.DeliveriesFor(c, s.now().UTC()),
		final: c.State.Done()}
	if cw.held = s.holdLarge(c.ID, c.Inputs, c.Outputs); cw.held != nil {
		cw.size += cw.held.refsBytes
	}
	if len(c.Inputs) > 0 {
		// A write without inputs keeps those stored: only a write that
		// carries them puts them.
		cw.inputOps = s.inputOps(c.ID, c.Inputs)
		if cw.held == nil || cw.held.in == nil {
			cw.size += len(c.Inputs)
		}
	}
	if len(cw.deliveries) > 0 {
		if cw.records, err = s.deliveryRecords(what, cw.deliveries); err != nil {
			return callWrite{}, err
		}
		for _, r := range cw.records {
			cw.size += len(r)
		}
	}
	// Bound at its first write, in queue order: the lease current when
	// the call became this node's (fence.go).
	cw.fence = s.fence.bindingFor(c.ID)
	return cw, nil
}

// callOps returns the etcd operations that store c with its outputs and
// indexes, not its inputs, and their size in bytes. Each is a put or delete
// of a fixed key, so applying them twice (a retried commit) stores the
// same. The payloads are stored as the bytes given, never encoded again.
func (s *Store) callOps(c store.Call) ([]clientv3.Op, int, error) {
	what := fmt.Sprintf("save call %s", c.ID)
	// Field by field, byte for byte json.Marshal's (store.AppendRecord):
	// every move of every call is encoded here, once. (Layout 2 wrote it
	// twice, the second under meta/ without the webhook URL; RecentCalls
	// reads calls/ and leaves the URL out itself.)
	rec, err := store.AppendRecord(nil, c)
	if err != nil {
		return nil, 0, fmt.Errorf("%s: encode: %w", what, err)
	}
	ops := []clientv3.Op{
		clientv3.OpPut(s.key("calls", c.ID), string(rec)),
	}
	ops = append(ops, s.outputOps(c.ID, c.Outputs)...) // outputs: what this write says
	inlineOut := len(c.Outputs)
	if s.payloads != nil && inlineOut > InlineLimit {
		inlineOut = 0 // held on nodes
	}
	if c.IdempotencyKey != "" {
		// A later call with the same team and key takes the key over.
		ops = append(ops, clientv3.OpPut(s.idemKey(c.TeamID, c.IdempotencyKey), c.ID))
	}
	if c.State.Done() {
		ops = append(ops, clientv3.OpDelete(s.key("pending", c.ID)),
			clientv3.OpPut(s.finishedKey(c.Finished, c.ID), ""))
		if op, ok, err := s.callUsageOp(what, c); err != nil {
			return nil, 0, err
		} else if ok {
			ops = append(ops, op) // the ledger's entry, in the call's transaction (usage.go)
		}
	} else {
		ops = append(ops, clientv3.OpPut(s.key("pending", c.ID), s.node))
	}
	return ops, len(rec) + inlineOut + 6*len(c.ID) + 128, nil
}

// idemKey is the idempotency index entry of a team's key; the key is
// hashed, as a client may put anything in it.
func (s *Store) idemKey(teamID, key string) string {
	sum := sha256.Sum256([]byte(key))
	return s.key("idem", teamID, hex.EncodeToString(sum[:]))
}

// CallByIdempotencyKey implements store.Calls: the call as GetCallResult
// returns it.
func (s *Store) CallByIdempotencyKey(teamID, key string) (store.Call, error) {
	const what = "call by idempotency key"
	if err := s.check(what); err != nil {
		return store.Call{}, err
	}
	id, _, ok, err := s.get(what, s.idemKey(teamID, key))
	if err != nil {
		return store.Call{}, err
	}
	if !ok {
		return store.Call{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	return s.readCall(what, string(id), false) // expired meanwhile: ErrNotFound
}

// finishedKey is the expiry index entry of a call finished at t. Times
// before 1970 sort as 0: nothing inferd writes.
func (s *Store) finishedKey(t time.Time, id string) string {
	return s.key("finished", fmt.Sprintf("%020d", max(t.UnixNano(), 0)), id)
}

// PendingCalls implements store.Calls: the pending index read at one
// revision, then the calls it names, and their inputs' sizes, read at that
// same revision, so the answer is one consistent moment. Only the calls
// whose entry names this node (Options.Node) are returned: those it wrote
// last, or the cluster leader handed to it (HandOver). The scheduler
// recovers them at start-up, and another node's calls are that node's to
// recover. Each is marked as this node's: its writes are fenced on its
// pending entry still naming this node (doc.go, "Fencing").
func (s *Store) PendingCalls() ([]store.Call, error) {
	at, err := s.callsPendingOn("pending calls", s.node, false)
	if err != nil {
		return nil, err
	}
	out := make([]store.Call, len(at))
	ids := make([]string, len(at))
	for i, c := range at {
		out[i], ids[i] = c.Call, c.Call.ID
	}
	// Handed out as this node's: their writes compare that they still are
	// (fence.go), so a call the leader handed on since is not written here.
	s.fence.handed(ids)
	return out, nil
}

// callsPendingOn reads the calls whose pending/<id> entry names node, with
// their inputs' sizes and their records' revisions: the pending index read
// at one revision, then the calls it names read at that same revision, so
// the answer is one consistent moment. skipBad leaves out a call whose
// record or input size does not decode; otherwise it is the error.
func (s *Store) callsPendingOn(what, node string, skipBad bool) ([]CallAt, error) {
	if err := s.check(what); err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	dir := s.key("pending") + "/"
	idx, err := s.rangeOf(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(what, err)
	}
	var ids []string
	for _, kv := range idx.Kvs {
		if string(kv.Value) == node {
			ids = append(ids, strings.TrimPrefix(string(kv.Key), dir))
		}
	}
	out := make([]CallAt, 0, len(ids))
	const perTxn = 60 // two reads each, under etcd's 128 operations per transaction
	for start := 0; start < len(ids); start += perTxn {
		var gets []clientv3.Op
		chunk := ids[start:min(start+perTxn, len(ids))]
		for _, id := range chunk {
			gets = append(gets, clientv3.OpGet(s.key("calls", id), clientv3.WithRev(idx.Header.Revision)),
				clientv3.OpGet(s.key("inputsize", id), clientv3.WithRev(idx.Header.Revision)))
		}
		resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn { return s.cli.Txn(ctx).Then(gets...) })
		if err != nil {
			return nil, s.wrap(what, err)
		}
		for i := range chunk {
			kvs := resp.Responses[2*i].GetResponseRange().Kvs
			if len(kvs) == 0 {
				continue // not reached: the index and the call change together
			}
			c, err := decode[store.Call](what, string(kvs[0].Key), kvs[0].Value)
			if err == nil {
				c.InputBytes, err = inputSize(what, resp.Responses[2*i+1])
			}
			switch {
			case err != nil && skipBad:
				continue
			case err != nil:
				return nil, err
			}
			out = append(out, CallAt{Call: c, Rev: kvs[0].ModRevision})
		}
	}
	return out, nil
}

// RecentCalls implements store.Calls: the call records (without inputs and
// outputs, and here without the webhook URL, which may carry a token in its
// query), newest id first, examining at most recentExamineLimit of them.
func (s *Store) RecentCalls(teamID string, limit int) ([]store.Call, error) {
	const what = "recent calls"
	if err := s.check(what); err != nil {
		return nil, err
	}
	out := []store.Call{}
	if limit <= 0 {
		return out, nil
	}
	ctx, cancel := s.ctx()
	defer cancel()
	dir := s.key("calls") + "/"
	end := clientv3.GetPrefixRangeEnd(dir)
	var rev int64
	page := int64(min(max(limit, 100), 1000))
	for examined := 0; examined < recentExamineLimit; {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithLimit(page),
			clientv3.WithSort(clientv3.SortByKey, clientv3.SortDescend)}
		if rev != 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		resp, err := s.rangeOf(ctx, dir, opts...)
		if err != nil {
			return nil, s.wrap(what, err)
		}
		rev = resp.Header.Revision
		for _, kv := range resp.Kvs {
			c, err := decode[store.Call](what, string(kv.Key), kv.Value)
			if err != nil {
				return nil, err
			}
			if teamID == "" || c.TeamID == teamID {
				c.Webhook = ""
				out = append(out, c)
				if len(out) == limit {
					return out, nil
				}
			}
		}
		examined += len(resp.Kvs)
		if !resp.More || len(resp.Kvs) == 0 {
			break
		}
		end = string(resp.Kvs[len(resp.Kvs)-1].Key) // exclusive: the next page is older
	}
	return out, nil
}

// ExpireCalls implements store.Calls. It walks the expiry index up to
// finishedBefore and deletes each call that is final and finished before
// it, in a transaction that compares the call's revision with the one
// read: a call another writer changed meanwhile (queued again, say) stays.
// Index entries left by earlier writes of a call are dropped on the way.
// The payloads an expired call held on nodes are deleted from them
// (Payloads.Delete) once its records are gone.
func (s *Store) ExpireCalls(finishedBefore time.Time) (int, error) {
	const what = "expire calls"
	if err := s.check(what); err != nil {
		return 0, err
	}
	dir := s.key("finished") + "/"
	ctx, cancel := context.WithTimeout(context.Background(), 4*s.reqTO)
	defer cancel()
	idx, err := s.rangeOf(ctx, dir, clientv3.WithRange(s.finishedKey(finishedBefore, "")), clientv3.WithKeysOnly())
	if err != nil {
		return 0, s.wrap(what, err)
	}
	n := 0
	for _, kv := range idx.Kvs {
		entry := string(kv.Key)
		id := entry[strings.LastIndexByte(entry, '/')+1:]
		ck := s.key("calls", id)
		read, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
			return s.cli.Txn(ctx).Then(clientv3.OpGet(ck), clientv3.OpGet(s.key("payloads", id)+"/", clientv3.WithPrefix()))
		})
		if err != nil {
			return n, s.wrap(what, err)
		}
		resp := read.Responses[0].GetResponseRange()
		var (
			cmps   []clientv3.Cmp // none when the call is gone: only its stale entry is left
			c      store.Call
			expire bool
			held   []string // the nodes that hold its payloads
		)
		if len(resp.Kvs) == 1 {
			if c, err = decode[store.Call](what, ck, resp.Kvs[0].Value); err != nil {
				return n, err
			}
			if held, err = heldNodes(what, read.Responses[1].GetResponseRange().Kvs); err != nil {
				return n, err
			}
			expire = c.State.Done() && c.Finished.Before(finishedBefore)
			keep := c.State.Done() && s.finishedKey(c.Finished, id) == entry
			if !expire && keep {
				continue // finished at the very edge: its entry stays
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(ck), "=", resp.Kvs[0].ModRevision))
		}
		ops := []clientv3.Op{clientv3.OpDelete(entry)}
		if expire {
			// meta/<id>: a layout 2 node's copy of the record, gone with it.
			ops = append(ops, clientv3.OpDelete(ck), clientv3.OpDelete(s.key("meta", id)), clientv3.OpDelete(s.key("pending", id)),
				clientv3.OpDelete(s.key("inputs", id)), clientv3.OpDelete(s.key("inputsize", id)), clientv3.OpDelete(s.key("outputs", id)),
				clientv3.OpDelete(s.key("payloads", id)+"/", clientv3.WithPrefix()))
			if c.IdempotencyKey != "" {
				// The key goes with the call, unless a later call took it over.
				ik := s.idemKey(c.TeamID, c.IdempotencyKey)
				ops = append(ops, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.Value(ik), "=", id)},
					[]clientv3.Op{clientv3.OpDelete(ik)}, nil))
			}
		}
		// Deletes are harmless to send again. A retry after a try whose
		// answer was lost fails its compare when that try was applied:
		// the call is gone, uncounted, and its held payloads are left to
		// the nodes' payload sweep (HeldPayload finds no ref).
		tr, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn { return s.cli.Txn(ctx).If(cmps...).Then(ops...) })
		if err != nil {
			return n, s.wrap(what, err)
		}
		if tr.Succeeded && expire {
			n++
			if len(held) > 0 && s.payloads != nil {
				// Only the sweeper whose delete won removes the copies.
				s.payloads.Delete(id, held)
			}
		}
	}
	if err := s.expireEnded(ctx, finishedBefore); err != nil {
		return n, s.wrap(what, err)
	}
	return n, nil
}
