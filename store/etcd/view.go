package etcd

import (
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
func (v *view) commit() (ok bool, err error) {
	var cmps []clientv3.Cmp
	for _, k := range slices.Sorted(maps.Keys(v.revs)) {
		cmps = append(cmps, clientv3.Compare(clientv3.ModRevision(k), "=", v.revs[k]))
	}
	var ops []clientv3.Op
	for _, k := range slices.Sorted(maps.Keys(v.writes)) {
		if val := v.writes[k]; val != nil {
			ops = append(ops, clientv3.OpPut(k, *val))
		} else {
			ops = append(ops, clientv3.OpDelete(k))
		}
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
	resp, err := v.s.cli.Txn(ctx).If(cmps...).Then(ops...).Commit()
	if err != nil {
		return false, v.s.wrap(v.what, err)
	}
	if projects && resp.Succeeded {
		v.s.projectWatch.committed(resp.Header.Revision)
	}
	return resp.Succeeded, nil
}
