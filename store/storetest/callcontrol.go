package storetest

import (
	"context"
	"errors"
	"testing"
	"time"

	"inferd/store"
)

// testIdempotencyKeyFindsCallPerTeamUntilExpiry: a call saved with an
// idempotency key is found by its team and key, across a reopen, not by
// another team's, and no more once the call has expired.
func testIdempotencyKeyFindsCallPerTeamUntilExpiry(t *testing.T, e *env) {
	s := e.open(t)
	ctx := context.Background()
	t0 := e.clock.Now()
	c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "acme", State: store.CallQueued,
		Inputs: []byte(`{"a":1}`), Created: t0, IdempotencyKey: "order-42",
		RequestHash: store.RequestHash("p", []byte(`{"a":1}`))}
	if err := s.SaveCall(ctx, c); err != nil {
		t.Fatal(err)
	}
	running := c
	running.State = store.CallRunning
	if err := s.SaveCall(ctx, running); err != nil {
		t.Fatal(err)
	}
	s = e.reopen(t, s)
	tests := []struct {
		name, team, key string
		want            string // call id; "" = ErrNotFound
	}{
		{"same team and key", "acme", "order-42", c.ID},
		{"other team", "other", "order-42", ""},
		{"other key", "acme", "order-43", ""},
		{"key is not a prefix", "acme", "order-4", ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := s.CallByIdempotencyKey(tc.team, tc.key)
			switch {
			case tc.want == "" && !errors.Is(err, store.ErrNotFound):
				t.Fatalf("CallByIdempotencyKey = %+v, %v; want ErrNotFound", got, err)
			case tc.want != "" && (err != nil || got.ID != tc.want || got.State != store.CallRunning || got.RequestHash != c.RequestHash):
				t.Fatalf("CallByIdempotencyKey = %+v, %v; want call %s running with its request hash", got, err, tc.want)
			}
		})
	}
	done := running
	done.State, done.Message, done.Finished = store.CallFailed, "error: cancelled by request", t0
	if err := s.SaveCall(ctx, done); err != nil {
		t.Fatal(err)
	}
	if got, err := s.CallByIdempotencyKey("acme", "order-42"); err != nil || got.Message != done.Message {
		t.Fatalf("after the final write: %+v, %v; want the finished call", got, err)
	}
	if n, err := s.ExpireCalls(t0.Add(time.Second)); err != nil || n != 1 {
		t.Fatalf("ExpireCalls = %d, %v; want 1", n, err)
	}
	if got, err := s.CallByIdempotencyKey("acme", "order-42"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("after expiry: %+v, %v; want ErrNotFound", got, err)
	}
}

// testCallControlFieldsSurviveReopen: what a start asked for (priority,
// timeouts) and the attempt count are durable, and so is a project's
// retries.
func testCallControlFieldsSurviveReopen(t *testing.T, e *env) {
	s := e.open(t)
	p := Project("p", "acme")
	p.Retries = 2
	if _, err := s.PutProject(p); err != nil {
		t.Fatal(err)
	}
	c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "acme", State: store.CallQueued,
		Created: e.clock.Now(), Priority: store.PriorityLow, Timeout: 7, QueueTimeout: 3, Attempt: 2}
	if err := s.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	s = e.reopen(t, s)
	pending, err := s.PendingCalls()
	if err != nil || len(pending) != 1 {
		t.Fatalf("PendingCalls = %+v, %v", pending, err)
	}
	got := pending[0]
	if got.Priority != store.PriorityLow || got.Timeout != 7 || got.QueueTimeout != 3 || got.Attempt != 2 {
		t.Errorf("call after reopen = %+v; want priority low, timeout 7, queueTimeout 3, attempt 2", got)
	}
	if gp, err := s.GetProject("p"); err != nil || gp.Retries != 2 {
		t.Errorf("project after reopen = %+v, %v; want retries 2", gp, err)
	}
	bad := Project("q", "acme")
	bad.Retries = store.MaxRetries + 1
	var ve *store.ValidationError
	if _, err := s.PutProject(bad); !errors.As(err, &ve) || ve.Field != "retries" {
		t.Errorf("PutProject with retries %d = %v; want a validation error naming retries", bad.Retries, err)
	}
}
