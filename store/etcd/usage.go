package etcd

import (
	"context"
	"fmt"
	"time"

	"github.com/google/uuid"
	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// The usage ledger in etcd (store.Usage). etcd has no increment, and
// several nodes add to the same hour's rows, so an addition is an entry of
// its own, never a read-modify-write on the call's path:
//
//	usage/c/<hour>/<call id>   a final call's usage row (store.CallUsageRow), put
//	                           by the call's first final write in its transaction
//	usage/c/<hour>/<uuid>      one AddUsage row (replica time)
//	usage/h/<hour>/<team>/<project>  the hour's roll-up of folded entries
//
// <hour> is unix seconds, 20 digits, so key order is time order. A read
// sums the rows and the entries of its hours. foldUsage moves the entries
// of hours that ended more than foldAfter ago into their rows, each
// transaction comparing the rows' revisions and the entries' presence, so
// an entry is counted once whichever node folds it. A call's entry is put
// under the call's id: a final write sent again puts the same entry.

// foldAfter is how long after its hour ends an hour's entries are folded:
// by then every call that finished in it has long been written.
const foldAfter = 15 * time.Minute

// foldBatch bounds the entries one fold transaction moves, under etcd's 128
// operations per transaction (an entry's delete, and its row's put).
const foldBatch = 60

func hourDigits(t time.Time) string { return fmt.Sprintf("%020d", max(store.UsageHour(t).Unix(), 0)) }

// usageEntryKey is the entry of an addition to hour t's rows.
func (s *Store) usageEntryKey(t time.Time, id string) string {
	return s.key("usage", "c", hourDigits(t), id)
}

// usageRowKey is the folded roll-up of one hour, team and project.
func (s *Store) usageRowKey(k store.UsageKey) string {
	return s.key("usage", "h", hourDigits(k.Hour), k.TeamID, k.ProjectID)
}

// callUsageOp is the put of final call c's usage entry, or false when the
// write adds no usage.
func (s *Store) callUsageOp(what string, c store.Call) (clientv3.Op, bool, error) {
	row, ok := store.CallUsageRow(c)
	if !ok {
		return clientv3.Op{}, false, nil
	}
	v, err := encode(what, row)
	if err != nil {
		return clientv3.Op{}, false, err
	}
	return clientv3.OpPut(s.usageEntryKey(row.Hour, c.ID), v), true, nil
}

// AddUsage implements store.Usage: one entry per summed row, in one
// transaction (up to 120 rows; more take one transaction per 120).
func (s *Store) AddUsage(rows []store.UsageRow) error {
	const what = "add usage"
	if err := s.check(what); err != nil {
		return err
	}
	for _, r := range rows {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	var ops []clientv3.Op
	for _, r := range store.SumUsage(rows) {
		v, err := encode(what, r)
		if err != nil {
			return err
		}
		ops = append(ops, clientv3.OpPut(s.usageEntryKey(r.Hour, uuid.NewString()), v))
	}
	for len(ops) > 0 {
		n := min(len(ops), batchOps)
		// Puts of fresh keys: a retry after a lost answer puts the same.
		// One request's bound, not retrying's longer one: nothing waits on
		// replica usage to make progress (a failed flush is taken back and
		// written with the next), and the scheduler's last flush at
		// shutdown must not wait out RetryFor without quorum.
		ctx, cancel := s.ctx()
		_, err := s.retry(ctx, func(ctx context.Context) error {
			_, err := s.cli.Txn(ctx).Then(ops[:n]...).Commit()
			return err
		})
		cancel()
		if err != nil {
			return s.wrap(what, err)
		}
		ops = ops[n:]
	}
	return nil
}

// UsageRows implements store.Usage: the folded rows and the entries not
// folded yet of the hours asked for, read at one revision and summed.
func (s *Store) UsageRows(teamID string, from, to time.Time) ([]store.UsageRow, error) {
	const what = "usage rows"
	out := []store.UsageRow{}
	if err := s.check(what); err != nil {
		return nil, err
	}
	if !from.Before(to) {
		return out, nil
	}
	// to is exclusive: the last hour read is the one before to's, unless
	// to is inside an hour.
	last := store.UsageHour(to)
	if last.Equal(to.UTC()) {
		last = last.Add(-time.Hour)
	}
	end := hourDigits(last) + "0" // past every key of the last hour ("/" < "0")
	ctx, cancel := s.ctx()
	defer cancel()
	read, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return s.cli.Txn(ctx).Then(
			clientv3.OpGet(s.key("usage", "h", hourDigits(from)), clientv3.WithRange(s.key("usage", "h", end))),
			clientv3.OpGet(s.key("usage", "c", hourDigits(from)), clientv3.WithRange(s.key("usage", "c", end))))
	})
	if err != nil {
		return nil, s.wrap(what, err)
	}
	var rows []store.UsageRow
	for _, r := range read.Responses {
		for _, kv := range r.GetResponseRange().Kvs {
			row, err := decode[store.UsageRow](what, string(kv.Key), kv.Value)
			if err != nil {
				return nil, err
			}
			if (teamID == "" || row.TeamID == teamID) && !row.Hour.Before(from) && row.Hour.Before(to) {
				rows = append(rows, row)
			}
		}
	}
	if rows == nil {
		return out, nil
	}
	return store.SumUsage(rows), nil
}

// ExpireUsage implements store.Usage. It first folds the entries of hours
// long ended into their rows (see foldUsage), as the sweeper calls it
// every sweepInterval, then deletes rows and entries of hours before
// `before`; it counts the rows and entries deleted.
func (s *Store) ExpireUsage(before time.Time) (int, error) {
	const what = "expire usage"
	if err := s.check(what); err != nil {
		return 0, err
	}
	if err := s.foldUsage(s.now().Add(-time.Hour - foldAfter)); err != nil {
		return 0, err
	}
	limit := fmt.Sprintf("%020d", max(before.Unix(), 0))
	ctx, cancel := s.ctx()
	defer cancel()
	resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return s.cli.Txn(ctx).Then(
			clientv3.OpDelete(s.key("usage", "h")+"/", clientv3.WithRange(s.key("usage", "h", limit))),
			clientv3.OpDelete(s.key("usage", "c")+"/", clientv3.WithRange(s.key("usage", "c", limit))))
	})
	if err != nil {
		return 0, s.wrap(what, err)
	}
	n := 0
	for _, r := range resp.Responses {
		n += int(r.GetResponseDeleteRange().Deleted)
	}
	return n, nil
}

// foldUsage moves the entries of the hours that began before `before`
// into their hours' rows, foldBatch at a time. Each transaction compares
// the revision of every row it writes (or its absence) and the presence
// of every entry it deletes: when another node folded some of them first,
// it reads again.
func (s *Store) foldUsage(before time.Time) error {
	const what = "fold usage"
	ctx, cancel := context.WithTimeout(context.Background(), 4*s.reqTO)
	defer cancel()
	limit := s.key("usage", "c", hourDigits(before))
	for range 1000 { // bounded: each round folds or loses a race
		resp, err := s.rangeOf(ctx, s.key("usage", "c")+"/", clientv3.WithRange(limit), clientv3.WithLimit(foldBatch))
		if err != nil {
			return s.wrap(what, err)
		}
		if len(resp.Kvs) == 0 {
			return nil
		}
		var adds []store.UsageRow
		var cmps []clientv3.Cmp
		var ops []clientv3.Op
		for _, kv := range resp.Kvs {
			row, err := decode[store.UsageRow](what, string(kv.Key), kv.Value)
			if err != nil {
				return err
			}
			adds = append(adds, row)
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(string(kv.Key)), "=", kv.ModRevision))
			ops = append(ops, clientv3.OpDelete(string(kv.Key)))
		}
		for _, add := range store.SumUsage(adds) {
			rk := s.usageRowKey(add.Key())
			cur, err := s.rangeOf(ctx, rk)
			if err != nil {
				return s.wrap(what, err)
			}
			sum := store.UsageRow{Hour: add.Hour, TeamID: add.TeamID, ProjectID: add.ProjectID}
			rev := int64(0)
			if len(cur.Kvs) == 1 {
				if sum, err = decode[store.UsageRow](what, rk, cur.Kvs[0].Value); err != nil {
					return err
				}
				rev = cur.Kvs[0].ModRevision
			}
			sum.Add(add)
			v, err := encode(what, sum)
			if err != nil {
				return err
			}
			cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(rk), "=", rev))
			ops = append(ops, clientv3.OpPut(rk, v))
		}
		// Its compares make it harmless to send again: a second apply
		// fails them. A failed compare (another node folded first, or an
		// earlier try was applied) leaves the next round to read again.
		err = s.retrying(func(ctx context.Context) error {
			_, err := s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
			return err
		})
		if err != nil {
			return s.wrap(what, err)
		}
	}
	return nil
}
