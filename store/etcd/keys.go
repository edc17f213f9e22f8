package etcd

import (
	"cmp"
	"context"
	"fmt"
	"slices"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// CreateKey implements store.Keys.
func (s *Store) CreateKey(teamID string, scope store.KeyScope) (string, store.APIKey, error) {
	return s.CreateScopedKey(teamID, scope, store.KeyLimits{})
}

// CreateScopedKey implements store.Keys. The key is created if its id is
// free (a compare on the id's CreateRevision), with its team, in one
// transaction; a taken id is drawn again. The transaction is sent again
// when a leader change lost its answer (retry.go): a try that was applied
// leaves the key there, which the next try finds with this very value (its
// secret's hash) and answers as created, so a retry never leaves two keys.
func (s *Store) CreateScopedKey(teamID string, scope store.KeyScope, lim store.KeyLimits) (string, store.APIKey, error) {
	what := fmt.Sprintf("create key for team %s", teamID)
	for {
		secret, k, err := store.NewKey(teamID, scope, lim, s.now())
		if err != nil {
			return "", store.APIKey{}, err
		}
		if err := s.check(what); err != nil {
			return "", store.APIKey{}, err
		}
		team, err := s.ensureTeamOp(what, teamID)
		if err != nil {
			return "", store.APIKey{}, err
		}
		v, err := encode(what, k)
		if err != nil {
			return "", store.APIKey{}, err
		}
		kk := s.key("keys", k.ID)
		ctx, cancel := s.ctx()
		resp, resent, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
			return s.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.CreateRevision(kk), "=", 0)).
				Then(clientv3.OpPut(kk, v), team).
				Else(clientv3.OpGet(kk))
		})
		cancel()
		if err != nil {
			return "", store.APIKey{}, s.wrap(what, err)
		}
		if resp.Succeeded || resent && foundValue(resp.Responses[0], v) {
			return secret, k, nil
		}
	}
}

// ListKeys implements store.Keys.
func (s *Store) ListKeys(teamID string) ([]store.APIKey, error) {
	out, err := list(s, "list keys", "keys", func(k store.APIKey) bool { return teamID == "" || k.TeamID == teamID })
	if err != nil {
		return nil, err
	}
	slices.SortFunc(out, func(a, b store.APIKey) int {
		return cmp.Or(cmp.Compare(a.TeamID, b.TeamID), a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// RevokeKey implements store.Keys: the revocation is written only over the
// record it read (a ModRevision compare), so a concurrent revocation keeps
// the first time. A write sent again after a lost answer whose first try
// was applied fails its compare, and the key read again is revoked: done.
func (s *Store) RevokeKey(id string) error {
	what := fmt.Sprintf("revoke key %s", id)
	kk := s.key("keys", id)
	for {
		if err := s.check(what); err != nil {
			return err
		}
		raw, rev, ok, err := s.get(what, kk)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("%s: %w", what, store.ErrNotFound)
		}
		k, err := decode[store.APIKey](what, kk, raw)
		if err != nil {
			return err
		}
		if k.IsRevoked() {
			return nil
		}
		k.Revoked = s.now().UTC()
		v, err := encode(what, k)
		if err != nil {
			return err
		}
		ctx, cancel := s.ctx()
		resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
			return s.cli.Txn(ctx).
				If(clientv3.Compare(clientv3.ModRevision(kk), "=", rev)).
				Then(clientv3.OpPut(kk, v))
		})
		cancel()
		if err != nil {
			return s.wrap(what, err)
		}
		if resp.Succeeded {
			return nil
		}
	}
}

// Authenticate implements store.Keys. It reads the key from etcd on every
// call (one linearizable read), so a revocation through any node is
// refused at once on every node.
func (s *Store) Authenticate(secret string) (store.APIKey, error) {
	id, ok := store.KeyIDOf(secret)
	if !ok {
		return store.APIKey{}, store.ErrInvalidKey
	}
	what := fmt.Sprintf("authenticate key %s", id)
	if err := s.check(what); err != nil {
		return store.APIKey{}, err
	}
	kk := s.key("keys", id)
	raw, _, found, err := s.get(what, kk)
	if err != nil {
		return store.APIKey{}, err
	}
	return s.keyOf(what, kk, secret, raw, found)
}

// keyOf is Authenticate's answer for secret from the record read at kk
// (found false: none).
func (s *Store) keyOf(what, kk, secret string, raw []byte, found bool) (store.APIKey, error) {
	if !found {
		return store.APIKey{}, store.ErrInvalidKey
	}
	k, err := s.keyRecords.decode(what, kk, raw) // its slices shared, as store/bolt's cached keys are
	if err != nil {
		return store.APIKey{}, err
	}
	if k.IsRevoked() || !k.Matches(secret) {
		return store.APIKey{}, store.ErrInvalidKey
	}
	return k, nil
}
