package memstore

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	"inferd/store"
	"inferd/store/storetest"
)

// TestContract runs the store contract suite against the in-memory store; a
// reopen is Reopen.
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) func() store.Store {
		var s *Store
		return func() store.Store {
			if s == nil {
				s = New(Options{Now: now})
			} else {
				s = s.Reopen()
			}
			return s
		}
	})
}

func TestHeldWriteIsNotVisibleUntilReleased(t *testing.T) {
	s := New(Options{})
	defer s.Close()
	s.HoldCallWrites(func(c store.Call) bool { return c.State.Done() })
	if err := s.SaveCall(context.Background(), store.Call{ID: "call_1", State: store.CallRunning}); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	s.SaveCallAsync(store.Call{ID: "call_1", State: store.CallSucceeded}, func(err error) { done <- err })
	// A write queued behind the held one waits too.
	behind := make(chan error, 1)
	s.SaveCallAsync(store.Call{ID: "call_2", State: store.CallQueued}, func(err error) { behind <- err })
	select {
	case err := <-done:
		t.Fatalf("held write reported done (%v) before its release", err)
	default:
	}
	if c, err := s.GetCall("call_1"); err != nil || c.State != store.CallRunning {
		t.Fatalf("GetCall while held = %s, %v; want running", c.State, err)
	}
	s.ReleaseCallWrite()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := <-behind; err != nil {
		t.Fatal(err)
	}
	if c, err := s.GetCall("call_1"); err != nil || c.State != store.CallSucceeded {
		t.Errorf("GetCall after release = %s, %v; want succeeded", c.State, err)
	}
	want := []store.CallState{store.CallRunning, store.CallSucceeded}
	var got []store.CallState
	for _, c := range s.CallHistory("call_1") {
		got = append(got, c.State)
	}
	if !slices.Equal(got, want) || s.CallWrites() != 3 {
		t.Errorf("history = %v (%d writes), want %v (3 writes)", got, s.CallWrites(), want)
	}
}

func TestCloseFailsAHeldWriteAndWhatQueuedBehindIt(t *testing.T) {
	s := New(Options{})
	s.HoldCallWrites(func(store.Call) bool { return true })
	errs := make(chan error, 2)
	for _, id := range []string{"call_1", "call_2"} {
		s.SaveCallAsync(store.Call{ID: id, State: store.CallQueued}, func(err error) { errs <- err })
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := <-errs; !errors.Is(err, store.ErrClosed) {
			t.Errorf("held write after Close = %v, want ErrClosed", err)
		}
	}
	if _, err := s.Reopen().GetCall("call_1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a write that never applied is found after reopen: %v", err)
	}
}

func TestFailedWriteIsNotApplied(t *testing.T) {
	s := New(Options{})
	defer s.Close()
	disk := errors.New("no space left on device")
	s.FailCallWrites(func(c store.Call) error {
		if c.State == store.CallSucceeded {
			return disk
		}
		return nil
	})
	if err := s.SaveCall(context.Background(), store.Call{ID: "call_1", State: store.CallQueued}); err != nil {
		t.Fatal(err)
	}
	if err := s.SaveCall(context.Background(), store.Call{ID: "call_1", State: store.CallSucceeded}); !errors.Is(err, disk) {
		t.Fatalf("SaveCall = %v, want the injected error", err)
	}
	if c, err := s.GetCall("call_1"); err != nil || c.State != store.CallQueued {
		t.Errorf("GetCall = %s, %v; want the last write that applied (queued)", c.State, err)
	}
}

func TestAddKeyTakesAFixedSecret(t *testing.T) {
	s := New(Options{})
	defer s.Close()
	const secret = "ik_00000000a1_acme"
	if err := s.AddKey(secret, store.APIKey{TeamID: "acme", Scope: store.ScopeAdmin}); err != nil {
		t.Fatal(err)
	}
	k, err := s.Authenticate(secret)
	if err != nil || k.ID != "00000000a1" || k.Scope != store.ScopeAdmin || k.Hash != store.HashKeySecret(secret) {
		t.Errorf("Authenticate = %+v, %v", k, err)
	}
	if teams, _ := s.ListTeams(); len(teams) != 1 || teams[0].ID != "acme" {
		t.Errorf("teams = %+v, want acme", teams)
	}
	for _, bad := range []string{"acme-secret", "ik_ZZZZZZZZZZ_x"} {
		if err := s.AddKey(bad, store.APIKey{TeamID: "acme"}); err == nil {
			t.Errorf("AddKey(%q) accepted a secret of the wrong shape", bad)
		}
	}
}
