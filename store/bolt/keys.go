package bolt

import (
	"cmp"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"sync"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// keyCache keeps keys that authenticated recently, so the hot path usually
// skips the read transaction and the JSON decode. Only this process writes
// the file (bbolt's lock), so the cache can only go stale through RevokeKey,
// which bumps gen and drops the entry after its commit. A lookup that read
// the file before that commit sees gen changed and does not cache what it
// read, so a revoked key fails the moment RevokeKey returns.
type keyCache struct {
	mu   sync.RWMutex
	gen  uint64
	keys map[string]cachedKey // key id → key; only keys that exist and were not revoked
}

// cachedKey is a key with its hash decoded, so a check hashes the secret
// and compares without allocating.
type cachedKey struct {
	key  store.APIKey
	hash [sha256.Size]byte
}

func (c *keyCache) init() { c.keys = make(map[string]cachedKey) }

func (c *keyCache) get(id string) (cachedKey, uint64, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	k, ok := c.keys[id]
	return k, c.gen, ok
}

func (c *keyCache) put(k cachedKey, gen uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gen == gen {
		c.keys[k.key.ID] = k
	}
}

func (c *keyCache) drop(id string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.gen++
	delete(c.keys, id)
}

// CreateKey creates an API key for the team, creating the team if it does not
// exist, and returns the secret, which is shown once and never stored. An
// empty scope means ScopeTeam.
func (s *Store) CreateKey(teamID string, scope store.KeyScope) (secret string, k store.APIKey, err error) {
	return s.CreateScopedKey(teamID, scope, store.KeyLimits{})
}

// CreateScopedKey is CreateKey for a key narrowed by lim.
func (s *Store) CreateScopedKey(teamID string, scope store.KeyScope, lim store.KeyLimits) (secret string, k store.APIKey, err error) {
	if _, _, err := store.NewKey(teamID, scope, lim, s.now()); err != nil {
		return "", store.APIKey{}, err
	}
	err = s.update(func(tx *bbolt.Tx) error {
		if _, err := s.ensureTeam(tx, teamID); err != nil {
			return err
		}
		b := tx.Bucket(bucketKeys)
		for {
			secret, k, _ = store.NewKey(teamID, scope, lim, s.now())
			if b.Get([]byte(k.ID)) != nil {
				continue // 40-bit id collision: draw again
			}
			v, err := json.Marshal(k)
			if err != nil {
				return err
			}
			return b.Put([]byte(k.ID), v)
		}
	})
	if err != nil {
		return "", store.APIKey{}, fmt.Errorf("create key for team %s: %w", teamID, err)
	}
	return secret, k, nil
}

// ListKeys returns the keys of a team, or of every team when teamID is "",
// sorted by team, then creation time. Revoked keys are included.
func (s *Store) ListKeys(teamID string) ([]store.APIKey, error) {
	var keys []store.APIKey
	err := s.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketKeys).ForEach(func(id, v []byte) error {
			var k store.APIKey
			if err := json.Unmarshal(v, &k); err != nil {
				return fmt.Errorf("decode key %s: %w", id, err)
			}
			if teamID == "" || k.TeamID == teamID {
				keys = append(keys, k)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list keys: %w", err)
	}
	slices.SortFunc(keys, func(a, b store.APIKey) int {
		return cmp.Or(cmp.Compare(a.TeamID, b.TeamID), a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	return keys, nil
}

// RevokeKey revokes the key with the given id; it fails with ErrNotFound if
// there is none. Revoking a revoked key keeps its first revocation time.
// Once RevokeKey returns, Authenticate refuses the key.
func (s *Store) RevokeKey(id string) error {
	err := s.update(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketKeys)
		v := b.Get([]byte(id))
		if v == nil {
			return store.ErrNotFound
		}
		var k store.APIKey
		if err := json.Unmarshal(v, &k); err != nil {
			return fmt.Errorf("decode: %w", err)
		}
		if k.IsRevoked() {
			return nil
		}
		k.Revoked = s.now().UTC()
		v, err := json.Marshal(k)
		if err != nil {
			return err
		}
		return b.Put([]byte(id), v)
	})
	// Drop the cache entry even if the commit failed: a failed commit may
	// still have reached the disk, and a miss only costs a read.
	s.keys.drop(id)
	if err != nil {
		return fmt.Errorf("revoke key %s: %w", id, err)
	}
	return nil
}

// Authenticate returns the key a secret belongs to. A malformed, unknown or
// revoked secret, or a wrong secret for a known id, fails with ErrInvalidKey.
// It is on every request's path: one short read transaction at most, with
// the hashes compared in constant time.
func (s *Store) Authenticate(secret string) (store.APIKey, error) {
	id, ok := store.KeyIDOf(secret)
	if !ok {
		return store.APIKey{}, store.ErrInvalidKey
	}
	ck, gen, ok := s.keys.get(id)
	if !ok {
		var (
			k     store.APIKey
			found bool
		)
		err := s.view(func(tx *bbolt.Tx) error {
			v := tx.Bucket(bucketKeys).Get([]byte(id))
			if v == nil {
				return nil
			}
			found = true
			return json.Unmarshal(v, &k)
		})
		if err != nil {
			return store.APIKey{}, fmt.Errorf("authenticate key %s: %w", id, err)
		}
		if !found || k.IsRevoked() {
			return store.APIKey{}, store.ErrInvalidKey
		}
		ck.key = k
		if n, err := hex.Decode(ck.hash[:], []byte(k.Hash)); err != nil || n != sha256.Size {
			return store.APIKey{}, fmt.Errorf("authenticate key %s: stored hash is not hex SHA-256", id)
		}
		s.keys.put(ck, gen)
	}
	sum := sha256.Sum256([]byte(secret))
	if subtle.ConstantTimeCompare(sum[:], ck.hash[:]) != 1 {
		return store.APIKey{}, store.ErrInvalidKey
	}
	return ck.key, nil
}
