package etcd

import (
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// EnsureTeam implements store.Teams: create-if-absent in one transaction.
func (s *Store) EnsureTeam(id string) (bool, error) {
	if err := store.ValidateTeamID(id); err != nil {
		return false, err
	}
	what := fmt.Sprintf("ensure team %s", id)
	if err := s.check(what); err != nil {
		return false, err
	}
	cmp, put, err := s.teamIfAbsent(what, id)
	if err != nil {
		return false, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.cli.Txn(ctx).If(cmp).Then(put).Commit()
	if err != nil {
		return false, s.wrap(what, err)
	}
	return resp.Succeeded, nil
}

// teamIfAbsent returns the compare and put that create team id if it does
// not exist.
func (s *Store) teamIfAbsent(what, id string) (clientv3.Cmp, clientv3.Op, error) {
	k := s.key("teams", id)
	v, err := encode(what, store.Team{ID: id, Created: s.now().UTC()})
	if err != nil {
		return clientv3.Cmp{}, clientv3.Op{}, err
	}
	return clientv3.Compare(clientv3.CreateRevision(k), "=", 0), clientv3.OpPut(k, v), nil
}

// ensureTeamOp is teamIfAbsent as one operation that can join a larger
// transaction (a nested transaction: the team is created only if missing,
// and the outer transaction succeeds either way).
func (s *Store) ensureTeamOp(what, id string) (clientv3.Op, error) {
	cmp, put, err := s.teamIfAbsent(what, id)
	if err != nil {
		return clientv3.Op{}, err
	}
	return clientv3.OpTxn([]clientv3.Cmp{cmp}, []clientv3.Op{put}, nil), nil
}

// ListTeams implements store.Teams.
func (s *Store) ListTeams() ([]store.Team, error) {
	return list[store.Team](s, "list teams", "teams")
}

// list returns every record under prefix/dir/, in key order.
func list[T any](s *Store, what, dir string) ([]T, error) {
	if err := s.check(what); err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.cli.Get(ctx, s.key(dir)+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(what, err)
	}
	out := make([]T, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		v, err := decode[T](what, strings.TrimPrefix(string(kv.Key), s.prefix), kv.Value)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, nil
}
