package etcd

import (
	"context"
	"maps"
	"slices"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// view is an optimistic transaction over a few keys, for the admin writes
// (projects): reads go to etcd once per key and remember the key's
// ModRevision; writes are kept here, and later reads of a written key see
// them; commit applies every write in one etcd transaction that compares
// each key read with the revision it had. When another writer changed one
// of them first, commit reports false and the caller starts again with a
// new view, so nothing is decided on stale data.
type view struct {
	s      *Store
	what   string
	revs   map[string]int64   // keys read: their ModRevision (0 = absent)
	vals   map[string][]byte  // what get returns now: read or written; nil = absent
	writes map[string]*string // pending: a value, or nil to delete
	teams  map[string]bool    // teams to create if missing
}

func newView(s *Store, what string) *view {
	return &view{s: s, what: what, revs: map[string]int64{}, vals: map[string][]byte{},
		writes: map[string]*string{}, teams: map[string]bool{}}
}

// get returns the value of key as this view sees it.
func (v *view) get(key string) ([]byte, bool, error) {
	if val, ok := v.vals[key]; ok {
		return val, val != nil, nil
	}
	raw, rev, ok, err := v.s.get(v.what, key)
	if err != nil {
		return nil, false, err
	}
	if !ok {
		raw = nil
	} else if raw == nil {
		raw = []byte{} // present but empty
	}
	v.revs[key], v.vals[key] = rev, raw
	return raw, ok, nil
}

func (v *view) put(key, val string) {
	v.writes[key] = &val
	v.vals[key] = []byte(val)
}

func (v *view) del(key string) {
	v.writes[key] = nil
	v.vals[key] = nil
}

// commit writes everything in one transaction, if no key read has changed
// since; ok is false when one has.
//
// The transaction is sent again when a leader change lost its answer
// (retry.go). A try that was applied makes the next one's compares fail;
// the transaction's Else then reads every key written, and when each holds
// what this view wrote (puts at one revision, deletes gone) the write is
// its own: ok. That needs a record no other writer could have written: a
// project record carries its write's token (projectRecord), so another
// update from the same read, the same record but for the token, is not
// taken for this one. Its watch event is then known as own by that revision; a
// delete's revision is not read, so the watch tells it once more.
func (v *view) commit() (ok bool, err error) {
	var cmps []clientv3.Cmp
	for _, k := range slices.Sorted(maps.Keys(v.revs)) {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", v.revs[k]))
	}
	var ops, reads []clientv3.Op
	written := slices.Sorted(maps.Keys(v.writes))
	for _, k := range written {
		if val := v.writes[k]; val != nil {
			ops = append(ops, clientv3.OpPut(k, *val))
		} else {
			ops = append(ops, clientv3.OpDelete(k))
		}
		reads = append(reads, clientv3.OpGet(k))
	}
	for _, team := range slices.Sorted(maps.Keys(v.teams)) {
		op, err := v.s.ensureTeamOp(v.what, team)
		if err != nil {
			return false, err
		}
		ops = append(ops, op)
	}
	// A project write's watch event must not reach the watch before its
	// revision is known as this store's own (see keyWatch).
	projects := false
	for k := range v.writes {
		projects = projects || strings.HasPrefix(k, v.s.key("projects")+"/")
	}
	if projects {
		v.s.projectWatch.mu.Lock()
		defer v.s.projectWatch.mu.Unlock()
	}
	ctx, cancel := v.s.ctx()
	defer cancel()
	resp, resent, err := v.s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return v.s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(reads...)
	})
	if err != nil {
		return false, v.s.wrap(v.what, err)
	}
	rev := resp.Header.Revision
	if !resp.Succeeded {
		if !resent {
			return false, nil
		}
		var own bool
		if own, rev = v.applied(written, resp); !own {
			return false, nil
		}
	}
	if projects && rev != 0 {
		v.s.projectWatch.committed(rev)
	}
	return true, nil
}

// applied reads the Else of a commit whose compares failed after a try
// without an answer: whether every key written holds what the view wrote,
// and the revision of its puts (0 when it wrote only deletes).
func (v *view) applied(written []string, resp *clientv3.TxnResponse) (own bool, rev int64) {
	if len(written) == 0 {
		return false, 0 // nothing of its own to find: a read changed
	}
	for i, k := range written {
		kvs := resp.Responses[i].GetResponseRange().Kvs
		val := v.writes[k]
		switch {
		case val == nil && len(kvs) == 0:
		case val != nil && len(kvs) == 1 && string(kvs[0].Value) == *val && (rev == 0 || kvs[0].ModRevision == rev):
			rev = kvs[0].ModRevision
		default:
			return false, 0
		}
	}
	return true, rev
}
