package admin

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"inferd/store"
	"inferd/store/memstore"
)

// The admin API's tests drive its handler as the CLI does, over a store in
// memory seeded with these helpers.

const (
	keyAcme  = "ik_000000000a_acme"
	keyOther = "ik_000000000b_other"
)

func testProject(id, team string) store.Project {
	return store.Project{
		ID: id, TeamID: team,
		MinReplicas: 0, MaxReplicas: 3, InferenceTimeout: 300, IdleTimeout: 30,
		Model: store.ModelSpec{
			KeyHash:     store.HashModelKey("mk-" + id),
			Command:     []string{"python3", "server.py"},
			Dir:         "/srv/" + id,
			Protocol:    "http",
			Concurrency: 1,
			BootTimeout: 600,
		},
	}
}

// testStore is the in-memory store with the seeding helpers the tests use.
type testStore struct{ *memstore.Store }

func newTestStore(t testing.TB) *testStore {
	st := &testStore{memstore.New(memstore.Options{})}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// addKey stores a key for a fixed secret (shaped like a real one, see
// store.KeyIDOf).
func (s *testStore) addKey(t testing.TB, secret, team string, scope store.KeyScope) {
	t.Helper()
	if err := s.AddKey(secret, store.APIKey{TeamID: team, Scope: scope, Created: time.Unix(1700000000, 0).UTC()}); err != nil {
		t.Fatal(err)
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

// serve runs one request through h.
func serve(h http.Handler, method, path, body string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	req.Header.Set("Content-Type", "application/json")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// apiErrorReply checks a JSON error answer of status and code and returns
// its message.
func apiErrorReply(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) string {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	body := decode[struct {
		Error struct{ Code, Message string }
	}](t, rec)
	if body.Error.Code != code || body.Error.Message == "" {
		t.Errorf("error = %+v, want code %q and a message", body.Error, code)
	}
	return body.Error.Message
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, rec.Body)
	}
	return v
}
