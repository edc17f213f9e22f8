package etcd

import (
	"context"
	"sync/atomic"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// opCounter counts what this store asks of etcd: requests (a get, put,
// delete or transaction, each one round to the cluster), and the reads and
// writes they carried out, nested transactions' included, for the branch
// that ran. A write is one put or delete, which every member applies and
// its log makes durable: what cluster mode pays per call (OpStats,
// docs/benchmarks.md). Watches are streams and are not counted.
type opCounter struct {
	requests, reads, writes atomic.Int64
}

// countingKV is etcd's KV with every request counted in n.
type countingKV struct {
	clientv3.KV
	n *opCounter
}

func (k countingKV) Put(ctx context.Context, key, val string, opts ...clientv3.OpOption) (*clientv3.PutResponse, error) {
	k.n.requests.Add(1)
	resp, err := k.KV.Put(ctx, key, val, opts...)
	if err == nil {
		k.n.writes.Add(1)
	}
	return resp, err
}

func (k countingKV) Get(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	k.n.requests.Add(1)
	resp, err := k.KV.Get(ctx, key, opts...)
	if err == nil {
		k.n.reads.Add(1)
	}
	return resp, err
}

func (k countingKV) Delete(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.DeleteResponse, error) {
	k.n.requests.Add(1)
	resp, err := k.KV.Delete(ctx, key, opts...)
	if err == nil {
		k.n.writes.Add(1)
	}
	return resp, err
}

func (k countingKV) Do(ctx context.Context, op clientv3.Op) (clientv3.OpResponse, error) {
	k.n.requests.Add(1)
	resp, err := k.KV.Do(ctx, op)
	if err == nil {
		k.n.count([]clientv3.Op{op}, nil)
	}
	return resp, err
}

func (k countingKV) Txn(ctx context.Context) clientv3.Txn {
	return &countingTxn{Txn: k.KV.Txn(ctx), n: k.n}
}

// countingTxn remembers a transaction's branches, to count the one that ran.
type countingTxn struct {
	clientv3.Txn
	n         *opCounter
	then, els []clientv3.Op
}

func (t *countingTxn) If(cs ...clientv3.Cmp) clientv3.Txn {
	t.Txn = t.Txn.If(cs...)
	return t
}

func (t *countingTxn) Then(ops ...clientv3.Op) clientv3.Txn {
	t.then = append(t.then, ops...)
	t.Txn = t.Txn.Then(ops...)
	return t
}

func (t *countingTxn) Else(ops ...clientv3.Op) clientv3.Txn {
	t.els = append(t.els, ops...)
	t.Txn = t.Txn.Else(ops...)
	return t
}

func (t *countingTxn) Commit() (*clientv3.TxnResponse, error) {
	t.n.requests.Add(1)
	resp, err := t.Txn.Commit()
	if err == nil {
		ran := t.then
		if !resp.Succeeded {
			ran = t.els
		}
		t.n.count(ran, resp.Responses)
	}
	return resp, err
}

// count adds ops, answered by resps (nil: not known, a nested transaction
// then counts its then branch), to the reads and writes.
func (n *opCounter) count(ops []clientv3.Op, resps []*pb.ResponseOp) {
	for i, op := range ops {
		switch {
		case op.IsGet():
			n.reads.Add(1)
		case op.IsPut(), op.IsDelete():
			n.writes.Add(1)
		case op.IsTxn():
			_, then, els := op.Txn()
			ran, sub := then, []*pb.ResponseOp(nil)
			if i < len(resps) {
				if tr := resps[i].GetResponseTxn(); tr != nil {
					sub = tr.Responses
					if !tr.Succeeded {
						ran = els
					}
				}
			}
			n.count(ran, sub)
		}
	}
}

// OpStats returns what this store has asked of etcd since Open, for
// metrics.
func (s *Store) OpStats() store.OpStats {
	return store.OpStats{Requests: s.ops.requests.Load(), Reads: s.ops.reads.Load(), Writes: s.ops.writes.Load()}
}
