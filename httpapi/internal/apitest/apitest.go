// Package apitest holds what the tests of the HTTP APIs (httpapi and the
// packages under it) share: a store in memory with seeding helpers, a
// valid project, and the requests and answer checks they make.
package apitest

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

// Project is a valid project id of team, its modelKey "mk-" + id.
func Project(id, team string) store.Project {
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

// Store is the in-memory store with the seeding helpers the tests use.
type Store struct{ *memstore.Store }

// NewStore returns an empty Store, closed when the test ends.
func NewStore(t testing.TB) *Store {
	st := &Store{memstore.New(memstore.Options{})}
	t.Cleanup(func() { _ = st.Close() })
	return st
}

// SeedKey stores a key for a fixed secret (shaped like a real one, see
// store.KeyIDOf), revoked if asked.
func (s *Store) SeedKey(t testing.TB, secret, team string, scope store.KeyScope, revoked bool) {
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

// SeedProject stores p, reachable with modelKey.
func (s *Store) SeedProject(t testing.TB, p store.Project, modelKey string) {
	t.Helper()
	p.Model.KeyHash = store.HashModelKey(modelKey)
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
}

// Project returns the stored project, or a zero one if there is none.
func (s *Store) Project(id string) store.Project {
	p, _ := s.GetProject(id)
	return p
}

// Serve runs one request through h: header is name, value pairs.
func Serve(h http.Handler, method, path, body string, header ...string) *httptest.ResponseRecorder {
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req := httptest.NewRequest(method, path, r)
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// ErrorReply checks a JSON error answer (the project, status and admin
// APIs' shape) of status and code, and returns its message.
func ErrorReply(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) string {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status %d, want %d; body %s", rec.Code, status, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("error body is not JSON: %v: %s", err, rec.Body)
	}
	if body.Error.Code != code || body.Error.Message == "" {
		t.Errorf("error = %+v, want code %q and a message", body.Error, code)
	}
	return body.Error.Message
}

// Decode decodes rec's JSON body as a T.
func Decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	var v T
	if err := json.Unmarshal(rec.Body.Bytes(), &v); err != nil {
		t.Fatalf("decode %T: %v: %s", v, err, rec.Body)
	}
	return v
}
