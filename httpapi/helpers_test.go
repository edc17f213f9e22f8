package httpapi

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"inferd/httpapi/internal/apitest"
	"inferd/internal/testenv"
	"inferd/store"
)

// Test fixtures: team acme owns echo and zeta, team other owns hidden.
const (
	keyAcme    = "ik_000000000a_acme"
	keyOther   = "ik_000000000b_other"
	keyAdmin   = "ik_000000000c_admin"
	keyRevoked = "ik_000000000d_revoked"
)

func testProject(id, team string) store.Project { return apitest.Project(id, team) }

type testEnv struct {
	store *testStore
	sched *fakeScheduler
	h     http.Handler
	logw  *lockedWriter
	// batchDir is the Batch API's directory, where a test gave it one.
	batchDir string
}

// logs returns what the handler has logged so far.
func (e *testEnv) logs() string {
	e.logw.mu.Lock()
	defer e.logw.mu.Unlock()
	return e.logw.w.(*bytes.Buffer).String()
}

func newEnv(t testing.TB, opts Options) *testEnv {
	t.Helper()
	st := newTestStore(t)
	st.addKey(t, keyAcme, "acme", store.ScopeTeam, false)
	st.addKey(t, keyOther, "other", store.ScopeTeam, false)
	st.addKey(t, keyAdmin, "ops", store.ScopeAdmin, false)
	st.addKey(t, keyRevoked, "acme", store.ScopeTeam, true)
	st.addProject(t, testProject("zeta", "acme"), "mk-zeta")
	st.addProject(t, testProject("echo", "acme"), "mk-echo")
	st.addProject(t, testProject("hidden", "other"), "mk-hidden")
	sched := newFakeScheduler()
	logw := &lockedWriter{w: new(bytes.Buffer)}
	opts.Log = zerolog.New(logw)
	if opts.APIVersion == "" {
		opts.APIVersion = "inferd/test"
	}
	return &testEnv{store: st, sched: sched, h: New(opts, st, sched), logw: logw}
}

// lockedWriter lets handlers log from several goroutines into one buffer.
type lockedWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// serve runs one request through h.
func serve(h http.Handler, method, path, body string, header ...string) *httptest.ResponseRecorder {
	return apitest.Serve(h, method, path, body, header...)
}

// serveAsync runs a request in a goroutine; the result arrives on the channel.
func serveAsync(h http.Handler, method, path, body string) <-chan *httptest.ResponseRecorder {
	out := make(chan *httptest.ResponseRecorder, 1)
	go func() { out <- serve(h, method, path, body) }()
	return out
}

// waitResult fails the test if a handler that must already be awake does
// not answer; the bound only guards against hanging forever.
func waitResult[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case rec := <-ch:
		return rec
	case <-time.After(testenv.Scale(10 * time.Second)):
		t.Fatal(testenv.Waited(10*time.Second, "the handler's answer"))
		var none T
		return none
	}
}

// waitLookup blocks until the handler has looked up the call id.
func waitLookup(t *testing.T, s *fakeScheduler, id string) {
	t.Helper()
	timeout := time.After(testenv.Scale(10 * time.Second))
	for {
		select {
		case got := <-s.lookups:
			if got == id {
				return
			}
		case <-timeout:
			t.Fatalf("no Lookup(%s)", id)
		}
	}
}

// inferenceReply decodes an inference response and checks the envelope every
// response must have: HTTP 200, JSON, id/message/created/apiVersion with the
// right types, callID a string, finished a boolean, modelOutputs null or an
// array.
func inferenceReply(t *testing.T, rec *httptest.ResponseRecorder) map[string]any {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d, want 200; body %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q", ct)
	}
	var m map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil {
		t.Fatalf("body is not a JSON object: %v: %s", err, rec.Body)
	}
	if id, ok := m["id"].(string); !ok || len(id) != 36 {
		t.Errorf("id = %#v, want a UUID string", m["id"])
	}
	if _, ok := m["message"].(string); !ok {
		t.Errorf("message = %#v, want a string", m["message"])
	}
	created, ok := m["created"].(float64)
	if !ok || created != float64(int64(created)) || created <= 0 {
		t.Errorf("created = %#v, want integer Unix seconds", m["created"])
	}
	if v, ok := m["apiVersion"].(string); !ok || v == "" {
		t.Errorf("apiVersion = %#v, want a string", m["apiVersion"])
	}
	if _, ok := m["callID"].(string); !ok {
		t.Errorf("callID = %#v, want a string", m["callID"])
	}
	if _, ok := m["finished"].(bool); !ok {
		t.Errorf("finished = %#v, want a boolean", m["finished"])
	}
	switch m["modelOutputs"].(type) {
	case nil, []any:
	default:
		t.Errorf("modelOutputs = %#v, want null or an array", m["modelOutputs"])
	}
	if _, present := m["modelOutputs"]; !present {
		t.Error("modelOutputs missing")
	}
	return m
}

// apiErrorReply checks a project/admin error response and returns its message.
func apiErrorReply(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) string {
	t.Helper()
	return apitest.ErrorReply(t, rec, status, code)
}

func decode[T any](t *testing.T, rec *httptest.ResponseRecorder) T {
	t.Helper()
	return apitest.Decode[T](t, rec)
}

// eventuallyTrue polls cond until it holds; the bound only guards against
// hanging forever.
func eventuallyTrue(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(testenv.Scale(10 * time.Second))
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(testenv.Waited(10*time.Second, "the condition"))
		}
		time.Sleep(time.Millisecond)
	}
}
