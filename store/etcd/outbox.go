package etcd

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// outboxRecord is a pending delivery as kept at outbox/<id>: the delivery,
// the node whose call write queued it (its deliverer sends it: see
// PendingDeliveries) and a token drawn for that write, which tells a retry
// of the write's commit that an earlier try put the record there.
type outboxRecord struct {
	store.Delivery
	Node  string `json:"node"`
	Write string `json:"write,omitempty"`
}

// deliveryRecords returns the outbox records of ds, queued by one call
// write of this node, encoded ahead of the writer's transaction.
func (s *Store) deliveryRecords(what string, ds []store.Delivery) ([]string, error) {
	token := rand.Text()
	out := make([]string, len(ds))
	for i, d := range ds {
		v, err := encode(what, outboxRecord{Delivery: d, Node: s.node, Write: token})
		if err != nil {
			return nil, err
		}
		out[i] = v
	}
	return out, nil
}

// queueOp puts a delivery's record into the outbox unless the store holds
// its id, pending or ended; otherwise it reads what is pending there, for
// queuedNow. It is one operation of the call write's transaction: the
// delivery is queued in the commit that makes it due.
func (s *Store) queueOp(id, record string) clientv3.Op {
	pending, ended := s.key("outbox", id), s.key("outboxended", id)
	return clientv3.OpTxn(
		[]clientv3.Cmp{
			clientv3.Compare(clientv3.CreateRevision(pending), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(ended), "=", 0),
		},
		[]clientv3.Op{clientv3.OpPut(pending, record)},
		[]clientv3.Op{clientv3.OpGet(pending)})
}

// queuedNow reports whether queueOp's response says the delivery was
// queued by this write: put now, or found pending with this write's own
// record (an earlier try of the same commit was applied).
func queuedNow(r *etcdserverpb.ResponseOp, record string) bool {
	t := r.GetResponseTxn()
	if t.Succeeded {
		return true
	}
	kvs := t.Responses[0].GetResponseRange().Kvs
	return len(kvs) == 1 && bytes.Equal(kvs[0].Value, []byte(record))
}

// PendingDeliveries implements store.Outbox: the deliveries not ended that
// this node's call writes queued, by id. Each node's deliverer sends the
// messages of the calls it ran, as each node recovers its own pending
// calls (PendingCalls); two nodes never send the same message at once.
func (s *Store) PendingDeliveries() ([]store.Delivery, error) {
	recs, err := list(s, "pending deliveries", "outbox", func(r outboxRecord) bool { return r.Node == s.node })
	if err != nil {
		return nil, err
	}
	out := make([]store.Delivery, len(recs))
	for i, r := range recs {
		out[i] = r.Delivery
	}
	return out, nil
}

// UpdateDelivery implements store.Outbox. The record is written over the
// one read (a revision compare), keeping the node that queued it; an end
// moves the id from outbox/ to outboxended/ in the same transaction. Like
// a call write, it is retried while etcd elects a leader: a retry that
// finds the delivery ended after a try whose answer was lost (it may have
// been applied) reports success.
func (s *Store) UpdateDelivery(d store.Delivery) error {
	what := fmt.Sprintf("update delivery %s", d.ID)
	pending, ended := s.key("outbox", d.ID), s.key("outboxended", d.ID)
	var (
		answer    error // the store's answer, when it is not etcd's error
		uncertain bool  // a write failed without an answer
	)
	err := s.retrying(func(ctx context.Context) error {
		for {
			if err := s.check(what); err != nil {
				answer = err
				return nil
			}
			resp, err := s.cli.Txn(ctx).Then(clientv3.OpGet(pending), clientv3.OpGet(ended, clientv3.WithCountOnly())).Commit()
			if err != nil {
				return err
			}
			kvs := resp.Responses[0].GetResponseRange().Kvs
			if len(kvs) == 0 {
				if !uncertain || d.Ended.IsZero() || resp.Responses[1].GetResponseRange().Count == 0 {
					answer = fmt.Errorf("%s: %w", what, store.ErrNotFound)
				}
				return nil
			}
			rec, err := decode[outboxRecord](what, pending, kvs[0].Value)
			if err != nil {
				answer = err
				return nil
			}
			rec.Delivery, rec.Write = d, ""
			ops := []clientv3.Op{clientv3.OpDelete(pending), clientv3.OpPut(ended, fmt.Sprintf("%020d", max(d.Ended.UnixNano(), 0)))}
			if d.Ended.IsZero() {
				v, err := encode(what, rec)
				if err != nil {
					answer = err
					return nil
				}
				ops = []clientv3.Op{clientv3.OpPut(pending, v)}
			}
			tr, err := s.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(pending), "=", kvs[0].ModRevision)).
				Then(ops...).Commit()
			if err != nil {
				uncertain = true
				return err
			}
			if tr.Succeeded {
				return nil
			}
		}
	})
	if err != nil {
		return s.wrap(what, err)
	}
	return answer
}

// OnDeliveryQueued implements store.Outbox: the hooks hear of the
// deliveries this node's call writes queue (those its deliverer sends).
func (s *Store) OnDeliveryQueued(fn func(store.Delivery)) { s.deliveryHooks.OnDeliveryQueued(fn) }

// expireEnded deletes the outboxended/ marks of deliveries that ended
// before limit: their calls are expired or about to be, so none can be
// written again. Each delete compares the mark's revision with the one
// read, as the call deletes of ExpireCalls do.
func (s *Store) expireEnded(ctx context.Context, limit time.Time) error {
	dir := s.key("outboxended") + "/"
	resp, err := s.rangeOf(ctx, dir, clientv3.WithPrefix())
	if err != nil {
		return err
	}
	edge := fmt.Sprintf("%020d", max(limit.UnixNano(), 0))
	var dels []clientv3.Op
	flush := func() error {
		if len(dels) == 0 {
			return nil
		}
		_, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn { return s.cli.Txn(ctx).Then(dels...) })
		dels = dels[:0]
		return err
	}
	for _, kv := range resp.Kvs {
		if string(kv.Value) >= edge {
			continue
		}
		k := string(kv.Key)
		dels = append(dels, clientv3.OpTxn([]clientv3.Cmp{clientv3.Compare(clientv3.ModRevision(k), "=", kv.ModRevision)},
			[]clientv3.Op{clientv3.OpDelete(k)}, nil))
		if len(dels) == 64 {
			if err := flush(); err != nil {
				return err
			}
		}
	}
	return flush()
}

// WebhookSecret implements store.Outbox. The secret is kept at
// secrets/<team>, apart from the team record, so that no team listing or
// team watch carries it. It is read from etcd on every call (no cache), so
// a rotation through any node signs with the new secret on every node at
// once. Drawing one is create-if-absent, so two nodes drawing the first
// secret of a team at once end with one; a rotation replaces it.
func (s *Store) WebhookSecret(teamID string, rotate bool) (string, error) {
	if err := store.ValidateTeamID(teamID); err != nil {
		return "", err
	}
	what := fmt.Sprintf("webhook secret of team %s", teamID)
	if err := s.check(what); err != nil {
		return "", err
	}
	k, team := s.key("secrets", teamID), s.key("teams", teamID)
	if !rotate {
		raw, _, ok, err := s.get(what, k)
		if err != nil {
			return "", err
		}
		if ok {
			return string(raw), nil
		}
	}
	secret := store.NewWebhookSecret()
	cmps := []clientv3.Cmp{clientv3.Compare(clientv3.CreateRevision(team), ">", 0)}
	if !rotate {
		cmps = append(cmps, clientv3.Compare(clientv3.CreateRevision(k), "=", 0))
	}
	ctx, cancel := s.ctx()
	defer cancel()
	// Harmless to send again: a retry finds the secret its earlier try
	// drew (create-if-absent) and answers it, or puts the same again.
	resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return s.cli.Txn(ctx).If(cmps...).
			Then(clientv3.OpPut(k, secret)).
			Else(clientv3.OpGet(team, clientv3.WithCountOnly()), clientv3.OpGet(k))
	})
	if err != nil {
		return "", s.wrap(what, err)
	}
	if resp.Succeeded {
		return secret, nil
	}
	if resp.Responses[0].GetResponseRange().Count == 0 {
		return "", fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	kvs := resp.Responses[1].GetResponseRange().Kvs
	if len(kvs) == 0 { // not reached: the compare that failed was the team's
		return "", fmt.Errorf("%s: secret vanished while drawn", what)
	}
	return string(kvs[0].Value), nil // drawn meanwhile through another node
}
