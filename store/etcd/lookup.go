package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// LookupStart is Authenticate and ProjectByModelKey for one start, read in
// one linearizable transaction instead of three reads one after the other
// (the key, the modelKey's index entry, then the project it names): the
// transaction also reads the project the index named last time, and only
// when the index names another one now is that project read as well. All
// of it is read at one revision, begun after the call, so a revocation or
// a project write committed through any node before the start is seen, as
// with the separate reads. Concurrent starts with the same key and modelKey
// share the transaction, as concurrent reads of one key share a Get. The
// project is not read when the key is refused.
func (s *Store) LookupStart(secret, modelKey string) store.StartLookup {
	id, ok := store.KeyIDOf(secret)
	if !ok {
		return store.StartLookup{KeyErr: store.ErrInvalidKey}
	}
	what := fmt.Sprintf("authenticate key %s", id)
	if err := s.check(what); err != nil {
		return store.StartLookup{KeyErr: err}
	}
	hash := store.HashModelKey(modelKey)
	kk, ik := s.key("keys", id), s.key("modelkeys", hash)
	reads := []clientv3.Op{clientv3.OpGet(kk), clientv3.OpGet(ik)}
	hint, _ := s.projectHint.Load(hash)
	guess, _ := hint.(string)
	if guess != "" {
		reads = append(reads, clientv3.OpGet(s.key("projects", guess)))
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.lookups.get(ctx, kk+"\x00"+ik+"\x00"+guess, func(ctx context.Context) (*clientv3.TxnResponse, error) {
		resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn { return s.cli.Txn(ctx).Then(reads...) })
		return resp, err
	})
	if err != nil {
		return store.StartLookup{KeyErr: s.wrap(what, err)}
	}
	var look store.StartLookup
	raw, found := valueOf(resp, 0)
	if look.Key, look.KeyErr = s.keyOf(what, kk, secret, raw, found); look.KeyErr != nil {
		return look
	}
	const byKey = "project by modelKey"
	pid, found := valueOf(resp, 1)
	switch {
	case !found:
		look.ProjectErr = fmt.Errorf("%s: %w", byKey, store.ErrNotFound)
		return look
	case string(pid) != guess:
		// First seen, or the modelKey moved to another project: read it.
		s.projectHint.Store(hash, string(pid))
		p, err := s.GetProject(string(pid))
		if err != nil {
			err = fmt.Errorf("%s: %w", byKey, err) // deleted meanwhile: ErrNotFound
		}
		look.Project, look.ProjectErr = p, err
		return look
	}
	pk := s.key("projects", guess)
	raw, found = valueOf(resp, 2)
	if !found {
		look.ProjectErr = fmt.Errorf("%s: get project %s: %w", byKey, guess, store.ErrNotFound)
		return look
	}
	p, err := s.projectRecords.decode(fmt.Sprintf("get project %s", guess), pk, raw)
	if err != nil {
		look.ProjectErr = fmt.Errorf("%s: %w", byKey, err)
		return look
	}
	look.Project = p.Clone() // the caller's own, as GetProject's is
	return look
}

// valueOf is the value the i-th read of a transaction of Gets found.
func valueOf(resp *clientv3.TxnResponse, i int) ([]byte, bool) {
	if i >= len(resp.Responses) {
		return nil, false
	}
	r := resp.Responses[i].GetResponseRange()
	if r == nil || len(r.Kvs) == 0 {
		return nil, false
	}
	return r.Kvs[0].Value, true
}
