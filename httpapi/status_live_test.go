package httpapi

import (
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/httpapi/status"
	"inferd/scheduler"
	"inferd/store"
)

// A sync start is written only when it ends. While it waits, the calls list
// shows it, from the scheduler, to its own team (and an admin) only, newest
// first among the stored calls and within the limit; its callID found there
// cancels it, and its client hears so. A live entry stands for an older
// record of its call (an async start written queued, running now), and a
// final record stands for a live entry (the call finished after the live
// calls were read).
func TestStatusListsASyncCallInFlightToItsTeamOnly(t *testing.T) {
	created := statusNow.Add(-time.Minute)
	stored := fakeCalls{ // newest first, as the store lists them
		{ID: "call_4", ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded, Created: created,
			Dispatched: created, Finished: created.Add(time.Second)},
		{ID: "call_3", ProjectID: "echo", TeamID: "acme", State: store.CallQueued, Created: created},
		{ID: "call_0", ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded, Created: created,
			Dispatched: created, Finished: created.Add(time.Second)},
	}
	var sched *fakeScheduler
	env := newEnv(t, Options{StartWait: time.Hour, Status: &status.Sources{
		Calls: stored,
		Live:  func(team string, limit int) []scheduler.LiveCall { return sched.LiveCalls(team, limit) },
		Now:   func() time.Time { return statusNow },
	}})
	sched = env.sched
	sched.add(store.Call{ID: "call_4", ProjectID: "echo", TeamID: "acme", State: store.CallRunning, Created: created})
	sched.add(store.Call{ID: "call_3", ProjectID: "echo", TeamID: "acme", State: store.CallRunning, Created: created,
		Dispatched: created, ReplicaID: "echo-1"})
	sched.add(store.Call{ID: "call_2", ProjectID: "hidden", TeamID: "other", State: store.CallRunning, Created: created})
	sched.add(store.Call{ID: "call_5", ProjectID: "zeta", TeamID: "acme", State: store.CallQueued, Created: created})
	if err := env.store.AddKey(keyZetaOnly, store.APIKey{TeamID: "acme", Scope: store.ScopeTeam,
		KeyLimits: store.KeyLimits{Projects: []string{"zeta"}}}); err != nil {
		t.Fatal(err)
	}

	start := serveAsync(env.h, http.MethodPost, "/start/v4",
		`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "modelInputs": {"secret": "input"}}`)
	waitLookup(t, sched, "call_1") // SubmitWait holds it: queued, written nowhere

	list := func(key, query string) []status.Call {
		t.Helper()
		rec := serve(env.h, http.MethodGet, "/v1/status/calls"+query, "", "X-Service-API-Key", key)
		if strings.Contains(rec.Body.String(), "secret") {
			t.Fatalf("the calls list shows a call's inputs: %s", rec.Body)
		}
		return decode[status.Results[status.Call]](t, rec).Results
	}
	ids := func(calls []status.Call) []string {
		var out []string
		for _, c := range calls {
			out = append(out, c.ID+" "+c.State)
		}
		return out
	}
	for _, tc := range []struct {
		name, key, query string
		want             []string
	}{
		{"its team", keyAcme, "", []string{"call_5 queued", "call_4 succeeded", "call_3 running", "call_1 queued", "call_0 succeeded"}},
		{"its team, limited", keyAcme, "?limit=4", []string{"call_5 queued", "call_4 succeeded", "call_3 running", "call_1 queued"}},
		{"its team's key for another project", keyZetaOnly, "", []string{"call_5 queued"}},
		{"another team", keyOther, "", []string{"call_2 running"}},
		{"an admin", keyAdmin, "", []string{"call_5 queued", "call_4 succeeded", "call_3 running", "call_2 running", "call_1 queued", "call_0 succeeded"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := ids(list(tc.key, tc.query)); !slices.Equal(got, tc.want) {
				t.Errorf("calls %q, want %q", got, tc.want)
			}
		})
	}
	calls := list(keyAcme, "")
	if c := calls[2]; c.ReplicaID != "echo-1" || c.Dispatched == nil || c.Finished != nil {
		t.Errorf("the running call = %+v, want it on echo-1, unfinished", c)
	}
	if c := calls[3]; c.ProjectID != "echo" || c.Dispatched != nil || c.Finished != nil || c.TotalMs != nil {
		t.Errorf("the sync start's call = %+v, want it queued, unfinished", c)
	}
	page := decode[status.All](t, serve(env.h, http.MethodGet, "/v1/status", "", "X-Service-API-Key", keyAcme))
	if got := ids(page.Calls); !slices.Equal(got, ids(calls)) {
		t.Errorf("the status page's calls %q, want /v1/status/calls' %q", got, ids(calls))
	}

	// The page's Cancel button: /cancel/v4 with the listed callID.
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/cancel/v4", `{"apiKey": "`+keyAcme+`", "callID": "`+calls[3].ID+`"}`))
	if m["message"] != msgCancelDone {
		t.Errorf("cancel of the listed call: %v", m)
	}
	if m := inferenceReply(t, waitResult(t, start)); m["message"] != "error: cancelled by request" || m["callID"] != "call_1" {
		t.Errorf("the sync start answered %v, want its call cancelled", m)
	}
}
