package bolt

import (
	"bytes"
	"fmt"
	"slices"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// What `inferd cluster import` reads to move a single box into a cluster:
// the records the store.Store interface has no way to list without
// changing them (WebhookSecret draws a secret; no method lists every call).
// Both only read, so they work on a store opened ReadOnly.

// exportPage is how many call ids one read transaction of EachCall
// collects: read transactions stay short (they block the file's growth).
const exportPage = 256

// TeamSecret returns the team's webhook signing secret, or "" when none was
// drawn. Unlike WebhookSecret it never draws one.
func (s *Store) TeamSecret(teamID string) (string, error) {
	var secret string
	err := s.view(func(tx *bbolt.Tx) error {
		if b := tx.Bucket(bucketTeamSecrets); b != nil {
			secret = string(b.Get([]byte(teamID)))
		}
		return nil
	})
	if err != nil {
		return "", fmt.Errorf("webhook secret of team %s: %w", teamID, err)
	}
	return secret, nil
}

// EachCall calls fn with every call, with its inputs and outputs, oldest
// first (call ids are UUIDv7), until fn returns an error, which EachCall
// returns. Each call is read in its own read transaction after a page of
// ids was listed, so fn runs with no transaction open. Calls whose writes
// are still only in the log (read-only, after a daemon was killed) come
// last.
func (s *Store) EachCall(fn func(store.Call) error) error {
	s.pend.flush()
	var after []byte
	for {
		var ids [][]byte
		err := s.view(func(tx *bbolt.Tx) error {
			cur := tx.Bucket(bucketCalls).Cursor()
			k, _ := cur.First()
			if after != nil {
				k, _ = cur.Seek(after)
				if bytes.Equal(k, after) {
					k, _ = cur.Next()
				}
			}
			for ; k != nil && len(ids) < exportPage; k, _ = cur.Next() {
				ids = append(ids, slices.Clone(k))
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("list calls: %w", err)
		}
		for _, id := range ids {
			c, err := s.readCall(string(id), "export call", true, true)
			if err != nil {
				return err
			}
			if err := fn(c); err != nil {
				return err
			}
		}
		if len(ids) < exportPage {
			return s.eachLoggedOnly(fn)
		}
		after = ids[len(ids)-1]
	}
}

// eachLoggedOnly calls fn with the calls the log knows and the data file
// does not, oldest first.
func (s *Store) eachLoggedOnly(fn func(store.Call) error) error {
	for _, id := range s.pend.ids() {
		var stored bool
		if err := s.view(func(tx *bbolt.Tx) error {
			stored = tx.Bucket(bucketCalls).Get([]byte(id)) != nil
			return nil
		}); err != nil {
			return fmt.Errorf("list calls: %w", err)
		}
		if stored {
			continue
		}
		c, err := s.readCall(id, "export call", true, true)
		if err != nil {
			return err
		}
		if err := fn(c); err != nil {
			return err
		}
	}
	return nil
}
