package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"inferd/store"
)

// A call's idempotency key finds it, within its team only, across a
// reopen, until the call expires; a later call with the same key does not
// take it over.
func testCallByIdempotencyKey(t *testing.T, e *env) {
	s := e.open(t)
	ctx := context.Background()
	first := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "acme", State: store.CallQueued,
		Created: e.clock.Now(), IdempotencyKey: "req-1"}
	second := first
	second.ID = newCallID()
	for _, c := range []store.Call{first, second} {
		if err := s.SaveCall(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if c, err := s.CallByIdempotencyKey("acme", "req-1"); err != nil || c.ID != first.ID {
		t.Fatalf("CallByIdempotencyKey = %s, %v; want the first call", c.ID, err)
	}
	for _, tc := range [][2]string{{"other", "req-1"}, {"acme", "req-2"}} {
		if _, err := s.CallByIdempotencyKey(tc[0], tc[1]); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("team %s key %s: %v, want ErrNotFound", tc[0], tc[1], err)
		}
	}
	first.State, first.Message, first.Finished = store.CallSucceeded, "success", e.clock.Now()
	if err := s.SaveCall(ctx, first); err != nil {
		t.Fatal(err)
	}
	s = e.reopen(t, s)
	if c, err := s.CallByIdempotencyKey("acme", "req-1"); err != nil || c.ID != first.ID || c.State != store.CallSucceeded {
		t.Fatalf("after reopen: %+v, %v", c, err)
	}
	e.clock.Advance(time.Hour)
	second.State, second.Finished = store.CallFailed, e.clock.Now()
	if err := s.SaveCall(ctx, second); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ExpireCalls(e.clock.Now().Add(-time.Minute)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CallByIdempotencyKey("acme", "req-1"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the key outlived its call: %v", err)
	}
}
