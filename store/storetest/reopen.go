package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"inferd/store"
)

func testCloseDrainsQueuedWrites(t *testing.T, e *env) {
	s := e.open(t)
	const n = 500
	results := make(chan error, n)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = newCallID()
		s.SaveCallAsync(store.Call{ID: ids[i], State: store.CallQueued}, func(err error) { results <- err })
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range n {
		if err := <-results; err != nil {
			t.Fatalf("queued write failed: %v", err)
		}
	}
	s = e.reopen(t, s)
	pending, err := s.PendingCalls()
	if err != nil || len(pending) != n {
		t.Errorf("after reopen %d pending calls, %v; want %d", len(pending), err, n)
	}
}

func testReopenKeepsTeamsKeysProjectsAndCalls(t *testing.T, e *env) {
	s := e.open(t)
	if _, err := s.EnsureTeam("acme"); err != nil {
		t.Fatal(err)
	}
	secret, key, err := s.CreateKey("labs", store.ScopeAdmin)
	if err != nil {
		t.Fatal(err)
	}
	proj := Project("resnet", "acme")
	proj.Model.Env = map[string]string{"A": "1"}
	if _, err := s.PutProject(proj); err != nil {
		t.Fatal(err)
	}
	call := store.Call{ID: newCallID(), ProjectID: "resnet", TeamID: "acme", State: store.CallQueued,
		Inputs: json.RawMessage(`{"prompt":"hi"}`), Created: time.Now().UTC()}
	if err := s.SaveCall(context.Background(), call); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	s = e.reopen(t, s)
	teams, err := s.ListTeams()
	if err != nil {
		t.Fatal(err)
	}
	if len(teams) != 2 || teams[0].ID != "acme" || teams[1].ID != "labs" {
		t.Errorf("teams = %+v, want acme and labs", teams)
	}
	got, err := s.Authenticate(secret)
	if err != nil || got.ID != key.ID || got.Scope != store.ScopeAdmin {
		t.Errorf("Authenticate = %+v, %v; want key %s", got, err, key.ID)
	}
	p, err := s.ProjectByModelKey("key-resnet")
	if err != nil || p.ID != "resnet" || p.Model.Env["A"] != "1" {
		t.Errorf("ProjectByModelKey = %+v, %v", p, err)
	}
	c, err := s.GetCall(call.ID)
	if err != nil || c.State != store.CallQueued || string(c.Inputs) != `{"prompt":"hi"}` {
		t.Errorf("GetCall = %+v, %v", c, err)
	}
	pending, err := s.PendingCalls()
	if err != nil || len(pending) != 1 || pending[0].ID != call.ID {
		t.Errorf("PendingCalls = %+v, %v", pending, err)
	}
}

func testClosedStoreReturnsErrClosed(t *testing.T, e *env) {
	s := e.open(t)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Errorf("second Close = %v, want nil", err)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"SaveCall", func() error {
			return s.SaveCall(context.Background(), store.Call{ID: newCallID(), State: store.CallQueued})
		}},
		{"GetCall", func() error { _, err := s.GetCall("call_x"); return err }},
		{"PutProject", func() error { _, err := s.PutProject(Project("p", "t")); return err }},
		{"Authenticate", func() error { _, err := s.Authenticate("ik_0123456789_abc"); return err }},
		{"ExpireCalls", func() error { _, err := s.ExpireCalls(time.Now()); return err }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, store.ErrClosed) {
				t.Errorf("%s after Close = %v, want ErrClosed", tc.name, err)
			}
		})
	}
}
