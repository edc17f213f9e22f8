package httpapi

import (
	"testing"
	"time"

	"inferd/store"
	"inferd/store/memstore"
)

// testStore is the in-memory store with the seeding helpers the tests use,
// and a way to make Authenticate fail or panic (the store's own paths to
// those are not reachable from a test).
type testStore struct {
	*memstore.Store
	authErr   error // returned by Authenticate when set
	authPanic bool
}

func newTestStore(t testing.TB) *testStore {
	st := &testStore{Store: memstore.New(memstore.Options{})}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

func (s *testStore) Authenticate(secret string) (store.APIKey, error) {
	if s.authPanic {
		panic("authenticate exploded")
	}
	if s.authErr != nil {
		return store.APIKey{}, s.authErr
	}
	return s.Store.Authenticate(secret)
}

// addKey stores a key for a fixed secret (shaped like a real one, see
// store.KeyIDOf), revoked if asked.
func (s *testStore) addKey(t testing.TB, secret, team string, scope store.KeyScope, revoked bool) {
	t.Helper()
	k := store.APIKey{TeamID: team, Scope: scope, Created: time.Unix(1700000000, 0).UTC()}
	if err := s.AddKey(secret, k); err != nil {
		t.Fatal(err)
	}
	if revoked {
		id, _ := store.KeyIDOf(secret)
		if err := s.RevokeKey(id); err != nil {
			t.Fatal(err)
		}
	}
}

// addProject stores p, reachable with modelKey.
func (s *testStore) addProject(t testing.TB, p store.Project, modelKey string) {
	t.Helper()
	p.Model.KeyHash = store.HashModelKey(modelKey)
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
}

// project returns the stored project, or a zero one if there is none.
func (s *testStore) project(id string) store.Project {
	p, _ := s.GetProject(id)
	return p
}
