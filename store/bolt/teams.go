package bolt

import (
	"encoding/json"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// EnsureTeam creates the team if it does not exist and reports whether it did.
func (s *Store) EnsureTeam(id string) (created bool, err error) {
	if err := store.ValidateTeamID(id); err != nil {
		return false, err
	}
	err = s.update(func(tx *bbolt.Tx) error {
		var err error
		created, err = s.ensureTeam(tx, id)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("ensure team %s: %w", id, err)
	}
	return created, nil
}

// ensureTeam creates team id inside tx if missing. Callers validated id.
func (s *Store) ensureTeam(tx *bbolt.Tx, id string) (bool, error) {
	b := tx.Bucket(bucketTeams)
	if b.Get([]byte(id)) != nil {
		return false, nil
	}
	v, err := json.Marshal(store.Team{ID: id, Created: s.now().UTC()})
	if err != nil {
		return false, err
	}
	return true, b.Put([]byte(id), v)
}

// ListTeams returns every team, sorted by id.
func (s *Store) ListTeams() ([]store.Team, error) {
	var teams []store.Team
	err := s.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketTeams).ForEach(func(k, v []byte) error {
			var t store.Team
			if err := json.Unmarshal(v, &t); err != nil {
				return fmt.Errorf("decode team %s: %w", k, err)
			}
			teams = append(teams, t)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list teams: %w", err)
	}
	return teams, nil
}

// GetTeam returns the team with the given id, or ErrNotFound.
func (s *Store) GetTeam(id string) (store.Team, error) {
	var t store.Team
	err := s.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketTeams).Get([]byte(id))
		if v == nil {
			return store.ErrNotFound
		}
		return json.Unmarshal(v, &t)
	})
	if err != nil {
		return store.Team{}, fmt.Errorf("get team %s: %w", id, err)
	}
	return t, nil
}

// SetTeamQuota replaces the team's quota, creating the team if missing.
func (s *Store) SetTeamQuota(id string, q store.Quota) (store.Team, error) {
	if err := store.ValidateTeamQuota(id, q); err != nil {
		return store.Team{}, err
	}
	var (
		t       store.Team
		changed bool
	)
	err := s.update(func(tx *bbolt.Tx) error {
		if _, err := s.ensureTeam(tx, id); err != nil {
			return err
		}
		b := tx.Bucket(bucketTeams)
		if err := json.Unmarshal(b.Get([]byte(id)), &t); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		// update may run fn again (db.Batch): changed is decided each time.
		changed = t.Quota != q
		if !changed {
			return nil
		}
		t.Quota = q
		v, err := json.Marshal(t)
		if err != nil {
			return err
		}
		return b.Put([]byte(id), v)
	})
	if err != nil {
		return store.Team{}, fmt.Errorf("set quota of team %s: %w", id, err)
	}
	if changed {
		s.NotifyTeam(id)
	}
	return t, nil
}
