package store

import (
	"encoding/json"
	"fmt"

	bolt "go.etcd.io/bbolt"
)

// ValidID reports whether s is a valid team or project id: 1 to 64
// characters of [a-z0-9-].
func ValidID(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// EnsureTeam creates the team if it does not exist and reports whether it did.
func (s *Store) EnsureTeam(id string) (created bool, err error) {
	if !ValidID(id) {
		return false, invalid("teamId", "must be 1-64 characters of a-z, 0-9 and -")
	}
	err = s.update(func(tx *bolt.Tx) error {
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
func (s *Store) ensureTeam(tx *bolt.Tx, id string) (bool, error) {
	b := tx.Bucket(bucketTeams)
	if b.Get([]byte(id)) != nil {
		return false, nil
	}
	v, err := json.Marshal(Team{ID: id, Created: s.now().UTC()})
	if err != nil {
		return false, err
	}
	return true, b.Put([]byte(id), v)
}

// ListTeams returns every team, sorted by id.
func (s *Store) ListTeams() ([]Team, error) {
	var teams []Team
	err := s.view(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketTeams).ForEach(func(k, v []byte) error {
			var t Team
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
