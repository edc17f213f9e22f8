package httpapi

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

// keyAcme2 is a second key of team acme.
const keyAcme2 = "ik_00000000f1_acmetwo"

// TestWaitCapsAreEachKeysOwn: the cap on requests held open (event
// streams, long polls) is per key, with a total over all keys. A key at its
// cap is refused another stream and answered a long poll at once; another key
// of its team, and a key of another team, still get theirs, on any project,
// until the total is reached.
func TestWaitCapsAreEachKeysOwn(t *testing.T) {
	// A long poll that waited would hold its request for the hour: one
	// answered at once had no wait to take.
	env := newEnv(t, Options{Limits: Limits{MaxWaitsPerKey: 1, MaxWaits: 3}, LongPollWait: time.Hour})
	env.store.addKey(t, keyAcme2, "acme", store.ScopeTeam, false)
	env.store.addProject(t, testProject("vault", "other"), "mk-vault")
	for _, c := range []struct{ id, project, team string }{
		{"call_echo", "echo", "acme"}, {"call_zeta", "zeta", "acme"},
		{"call_hidden", "hidden", "other"}, {"call_vault", "vault", "other"},
	} {
		env.sched.add(store.Call{ID: c.id, ProjectID: c.project, TeamID: c.team, State: store.CallRunning, Created: time.Now()})
	}
	srv := httptest.NewServer(env.h)
	t.Cleanup(srv.Close) // after the streams' own cleanups, which end them

	// Reading a stream's first event proves its handler holds a wait.
	openEvents(t, srv.URL, "call_echo", keyAcme).expect("state", "")

	status, body := getEvents(t, srv.URL, "call_zeta", keyAcme)
	if status != http.StatusTooManyRequests || !strings.Contains(body, "too many requests of this API key are waiting") {
		t.Fatalf("acme's key, at its cap, opening a stream on another project: %d %s", status, body)
	}
	poll := serveAsync(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_zeta", "longPoll": true}`)
	assertPending(t, waitResult(t, poll)) // answered at once: the key holds no second wait

	openEvents(t, srv.URL, "call_zeta", keyAcme2).expect("state", "")  // acme's other key has its own
	openEvents(t, srv.URL, "call_vault", keyOther).expect("state", "") // so has another team's

	status, body = getEvents(t, srv.URL, "call_hidden", keyAdmin)
	if status != http.StatusTooManyRequests {
		t.Fatalf("a fourth stream over the total of 3: %d %s", status, body)
	}
}

// getEvents opens an event stream that is expected to be refused and
// returns its status and body.
func getEvents(t *testing.T, base, callID, key string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, base+"/v1/calls/"+callID+"/events", nil)
	req.Header.Set("X-Service-API-Key", key)
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
