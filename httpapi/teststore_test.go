package httpapi

import (
	"testing"

	"inferd/httpapi/internal/apitest"
	"inferd/store"
)

// testStore is the in-memory store with the seeding helpers the tests use,
// and a way to make Authenticate fail or panic (the store's own paths to
// those are not reachable from a test).
type testStore struct {
	*apitest.Store
	authErr   error // returned by Authenticate when set
	authPanic bool
}

func newTestStore(t testing.TB) *testStore {
	return &testStore{Store: apitest.NewStore(t)}
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

// addKey stores a key for a fixed secret, revoked if asked.
func (s *testStore) addKey(t testing.TB, secret, team string, scope store.KeyScope, revoked bool) {
	t.Helper()
	s.SeedKey(t, secret, team, scope, revoked)
}

// addProject stores p, reachable with modelKey.
func (s *testStore) addProject(t testing.TB, p store.Project, modelKey string) {
	t.Helper()
	s.SeedProject(t, p, modelKey)
}

// project returns the stored project, or a zero one if there is none.
func (s *testStore) project(id string) store.Project { return s.Project(id) }
