package etcd

import (
	"context"
	"fmt"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// The Import methods write records read from a single box's data file
// (`inferd cluster import`) as they are: ids, creation times, key hashes
// and call states kept, nothing drawn anew. Each record is created only if
// absent, in one transaction with its index entries, so an import that is
// run again, or resumed after a failure, writes only what is missing and
// never replaces what the cluster holds. Each reports whether it wrote.

// ImportTeam creates team t, with its webhook signing secret when secret
// is not "", if no team t.ID exists.
func (s *Store) ImportTeam(t store.Team, secret string) (bool, error) {
	what := fmt.Sprintf("import team %s", t.ID)
	if err := store.ValidateTeamQuota(t.ID, t.Quota); err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	v, err := encode(what, t)
	if err != nil {
		return false, err
	}
	ops := []clientv3.Op{clientv3.OpPut(s.key("teams", t.ID), v)}
	if secret != "" {
		ops = append(ops, clientv3.OpPut(s.key("secrets", t.ID), secret))
	}
	return s.createIfAbsent(what, []string{s.key("teams", t.ID)}, ops)
}

// ImportKey creates API key k (its hash, scope, limits and revocation as
// they are) if no key k.ID exists. Its team must have been imported.
func (s *Store) ImportKey(k store.APIKey) (bool, error) {
	what := fmt.Sprintf("import key %s", k.ID)
	v, err := encode(what, k)
	if err != nil {
		return false, err
	}
	team, err := s.ensureTeamOp(what, k.TeamID)
	if err != nil {
		return false, err
	}
	kk := s.key("keys", k.ID)
	return s.createIfAbsent(what, []string{kk}, []clientv3.Op{clientv3.OpPut(kk, v), team})
}

// ImportProject creates project p with its modelKey index entry if neither
// the project nor the entry exists. A modelKey that another project of the
// cluster holds fails with store.ErrConflict.
func (s *Store) ImportProject(p store.Project) (bool, error) {
	what := fmt.Sprintf("import project %s", p.ID)
	if err := p.Validate(); err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	v, err := encode(what, p)
	if err != nil {
		return false, err
	}
	team, err := s.ensureTeamOp(what, p.TeamID)
	if err != nil {
		return false, err
	}
	pk, idx := s.key("projects", p.ID), s.key("modelkeys", p.Model.KeyHash)
	created, err := s.createIfAbsent(what, []string{pk, idx},
		[]clientv3.Op{clientv3.OpPut(pk, v), clientv3.OpPut(idx, p.ID), team})
	if err != nil || created {
		return created, err
	}
	owner, _, taken, err := s.get(what, idx)
	if err != nil {
		return false, err
	}
	if _, _, exists, err := s.get(what, pk); err != nil {
		return false, err
	} else if !exists && taken {
		return false, fmt.Errorf("%s: modelKey already belongs to project %s: %w", what, owner, store.ErrConflict)
	}
	return false, nil
}

// ImportCall creates call c, with its payloads and index entries as a
// call write stores them (callOps), if no call c.ID exists. A call not
// final is pending on this store's node (Options.Node), which recovers it
// at start-up as a single box does after a restart. No webhook message is
// queued for it. Its payloads are kept in etcd, so the store must have no
// Options.Payloads; one over MaxInlinePayload fails with
// ErrPayloadTooLarge.
func (s *Store) ImportCall(c store.Call) (bool, error) {
	what := fmt.Sprintf("import call %s", c.ID)
	if err := store.ValidateCallID(c.ID); err != nil {
		return false, fmt.Errorf("%s: %w", what, err)
	}
	if s.payloads != nil {
		// Held payloads need a node that serves them; import runs on none.
		return false, fmt.Errorf("%s: the import's store keeps payloads in etcd (open it without Options.Payloads)", what)
	}
	for name, b := range map[string][]byte{KindInputs: c.Inputs, KindOutputs: c.Outputs} {
		if len(b) > MaxInlinePayload {
			return false, fmt.Errorf("%s: %s are %d bytes, over %d: %w", what, name, len(b), MaxInlinePayload, ErrPayloadTooLarge)
		}
	}
	ops, _, inlineIn, err := s.callOps(c)
	if err != nil {
		return false, err
	}
	if len(c.Inputs) > 0 && !inlineIn {
		ops = append(ops, s.inputOps(c.ID, c.Inputs)...)
	}
	return s.createIfAbsent(what, []string{s.key("calls", c.ID)}, ops)
}

// createIfAbsent commits ops if none of keys exists, and reports whether
// it did. ops[0] puts keys[0]. It is sent again when a leader change lost
// its answer: a try that was applied is found by that put's value.
func (s *Store) createIfAbsent(what string, keys []string, ops []clientv3.Op) (bool, error) {
	if err := s.check(what); err != nil {
		return false, err
	}
	cmps := make([]clientv3.Cmp, len(keys))
	for i, k := range keys {
		cmps[i] = clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, resent, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return s.cli.Txn(ctx).If(cmps...).Then(ops...).Else(clientv3.OpGet(keys[0]))
	})
	if err != nil {
		return false, s.wrap(what, err)
	}
	return resp.Succeeded || resent && foundValue(resp.Responses[0], string(ops[0].ValueBytes())), nil
}
