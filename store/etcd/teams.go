package etcd

import (
	"context"
	"crypto/rand"
	"fmt"
	"strings"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// EnsureTeam implements store.Teams: create-if-absent in one transaction,
// sent again when a leader change lost its answer: a try that was applied
// is found by its value (its write's token: teamRecord) and reported as the
// creation.
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
	resp, resent, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn {
		return s.cli.Txn(ctx).If(cmp).Then(put).Else(clientv3.OpGet(string(put.KeyBytes())))
	})
	if err != nil {
		return false, s.wrap(what, err)
	}
	return resp.Succeeded || resent && foundValue(resp.Responses[0], string(put.ValueBytes())), nil
}

// teamRecord is a team as its creation stores it: the team and a token
// drawn for that write, so that a creation sent again after a lost answer
// tells its own applied try from a creation before it, whose record is the
// same but for the token when the clock gives both one Created stamp (as
// projectRecord does for project writes). Readers decode a store.Team.
type teamRecord struct {
	store.Team
	Write string `json:"write"`
}

// teamIfAbsent returns the compare and put that create team id if it does
// not exist.
func (s *Store) teamIfAbsent(what, id string) (clientv3.Cmp, clientv3.Op, error) {
	k := s.key("teams", id)
	v, err := encode(what, teamRecord{Team: store.Team{ID: id, Created: s.now().UTC()}, Write: rand.Text()})
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

// GetTeam implements store.Teams.
func (s *Store) GetTeam(id string) (store.Team, error) {
	return getRecord[store.Team](s, fmt.Sprintf("get team %s", id), s.key("teams", id))
}

// SetTeamQuota implements store.Teams: the team is written over the record
// it read (a revision compare; create-if-absent for a new team), read again
// when another node got there first.
func (s *Store) SetTeamQuota(id string, q store.Quota) (store.Team, error) {
	if err := store.ValidateTeamQuota(id, q); err != nil {
		return store.Team{}, err
	}
	what := fmt.Sprintf("set quota of team %s", id)
	k := s.key("teams", id)
	for {
		if err := s.check(what); err != nil {
			return store.Team{}, err
		}
		raw, rev, ok, err := s.get(what, k)
		if err != nil {
			return store.Team{}, err
		}
		t := store.Team{ID: id, Created: s.now().UTC()}
		cmp := clientv3.Compare(clientv3.CreateRevision(k), "=", 0)
		if ok {
			if t, err = decode[store.Team](what, k, raw); err != nil {
				return store.Team{}, err
			}
			if t.Quota == q {
				return t, nil
			}
			cmp = clientv3.Compare(clientv3.ModRevision(k), "=", rev)
		}
		t.Quota = q
		v, err := encode(what, t)
		if err != nil {
			return store.Team{}, err
		}
		done, err := s.commitTeam(what, cmp, clientv3.OpPut(k, v))
		if err != nil {
			return store.Team{}, err
		}
		if done {
			s.teamHooks.NotifyTeam(id)
			return t, nil
		}
	}
}

// commitTeam commits a team write, recorded as this store's own so that
// the team watch does not tell it again. It is sent again when a leader
// change lost its answer: a try that was applied makes the next one's
// compare fail, SetTeamQuota reads the team again and finds its quota set,
// and the team watch tells the hooks of it (a write not known as own).
func (s *Store) commitTeam(what string, cmp clientv3.Cmp, put clientv3.Op) (bool, error) {
	s.teamWatch.mu.Lock()
	defer s.teamWatch.mu.Unlock()
	ctx, cancel := s.ctx()
	defer cancel()
	resp, _, err := s.commitTxn(ctx, func(ctx context.Context) clientv3.Txn { return s.cli.Txn(ctx).If(cmp).Then(put) })
	if err != nil {
		return false, s.wrap(what, err)
	}
	if resp.Succeeded {
		s.teamWatch.committed(resp.Header.Revision)
	}
	return resp.Succeeded, nil
}

// OnTeamChange implements store.Teams. Quota changes made through other
// nodes reach the hooks through a watch.
func (s *Store) OnTeamChange(fn func(teamID string)) { s.teamHooks.OnTeamChange(fn) }

// ListTeams implements store.Teams.
func (s *Store) ListTeams() ([]store.Team, error) {
	return list(s, "list teams", "teams", func(store.Team) bool { return true })
}

// list returns the records under prefix/dir/ that keep accepts, in key
// order.
func list[T any](s *Store, what, dir string, keep func(T) bool) ([]T, error) {
	if err := s.check(what); err != nil {
		return nil, err
	}
	ctx, cancel := s.ctx()
	defer cancel()
	resp, err := s.rangeOf(ctx, s.key(dir)+"/", clientv3.WithPrefix())
	if err != nil {
		return nil, s.wrap(what, err)
	}
	out := make([]T, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		v, err := decode[T](what, strings.TrimPrefix(string(kv.Key), s.prefix), kv.Value)
		if err != nil {
			return nil, err
		}
		if keep(v) {
			out = append(out, v)
		}
	}
	return out, nil
}
