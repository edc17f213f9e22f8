package storetest

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/store"
)

// PendingDeliveryIDs returns the ids of s's pending deliveries, by id.
func PendingDeliveryIDs(t testing.TB, s store.Outbox) []string {
	t.Helper()
	ds, err := s.PendingDeliveries()
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, d := range ds {
		ids = append(ids, d.ID)
	}
	return ids
}

// A call's webhook deliveries are queued by the call writes that make them
// due, once each however often the call is written, survive a reopen while
// pending, and are never queued again once ended.
func testCallWritesQueueWebhookDeliveriesOnce(t *testing.T, e *env) {
	s := e.open(t)
	ctx := context.Background()
	var mu sync.Mutex
	var heard []string
	s.OnDeliveryQueued(func(d store.Delivery) {
		mu.Lock()
		heard = append(heard, d.ID)
		mu.Unlock()
	})
	c := store.Call{
		ID: newCallID(), ProjectID: "p", TeamID: "acme", State: store.CallQueued,
		Created: e.clock.Now(), Webhook: "http://127.0.0.1:9/hook",
		WebhookEvents: []string{store.EventStart, store.EventCompleted},
	}
	plain := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "acme", State: store.CallSucceeded, Created: e.clock.Now()}
	start, completed := store.DeliveryID(c.ID, store.EventStart), store.DeliveryID(c.ID, store.EventCompleted)
	save := func(c store.Call) {
		t.Helper()
		if err := s.SaveCall(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	save(c)
	save(plain)
	if got := PendingDeliveryIDs(t, s); len(got) != 0 {
		t.Fatalf("queued call: pending %v, want none", got)
	}
	c.State, c.Dispatched = store.CallRunning, e.clock.Now()
	save(c)
	save(c)
	if got := PendingDeliveryIDs(t, s); !slices.Equal(got, []string{start}) {
		t.Fatalf("running call written twice: pending %v, want [%s]", got, start)
	}
	c.State, c.Message, c.Outputs = store.CallSucceeded, "success", []byte(`{"ok":true}`)
	save(c)
	want := []string{completed, start}
	slices.Sort(want)
	if got := PendingDeliveryIDs(t, s); !slices.Equal(got, want) {
		t.Fatalf("finished call: pending %v, want %v", got, want)
	}
	mu.Lock()
	if !slices.Equal(heard, []string{start, completed}) {
		t.Errorf("OnDeliveryQueued heard %v, want [%s %s]", heard, start, completed)
	}
	mu.Unlock()

	s = e.reopen(t, s)
	ds, err := s.PendingDeliveries()
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 {
		t.Fatalf("after reopen: %d pending deliveries, want 2", len(ds))
	}
	for _, d := range ds {
		if d.CallID != c.ID || d.TeamID != "acme" || d.URL != c.Webhook || d.Created.IsZero() || d.NextAttempt.IsZero() {
			t.Errorf("delivery %+v lost its call, team, url or times", d)
		}
	}
	d := ds[0]
	d.Attempts, d.LastError = 1, "HTTP 500"
	d.NextAttempt = d.NextAttempt.Add(time.Minute)
	if err := s.UpdateDelivery(d); err != nil {
		t.Fatal(err)
	}
	ds2, _ := s.PendingDeliveries()
	if ds2[0].Attempts != 1 || ds2[0].LastError != "HTTP 500" || !ds2[0].NextAttempt.Equal(d.NextAttempt) {
		t.Errorf("attempt not recorded: %+v", ds2[0])
	}
	for _, d := range ds {
		d.Ended, d.Delivered = e.clock.Now(), true
		if err := s.UpdateDelivery(d); err != nil {
			t.Fatal(err)
		}
	}
	save(c) // a re-save of the finished call
	s = e.reopen(t, s)
	save(c)
	if got := PendingDeliveryIDs(t, s); len(got) != 0 {
		t.Fatalf("ended deliveries queued again: %v", got)
	}
	if err := s.UpdateDelivery(d); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("UpdateDelivery of an ended delivery: %v, want ErrNotFound", err)
	}
}

// A call with a webhook and no events gets completed only, also when it
// finishes without a running write (a synchronous start).
func testWebhookDefaultsToCompleted(t *testing.T, e *env) {
	s := e.open(t)
	c := store.Call{
		ID: newCallID(), ProjectID: "p", TeamID: "acme", State: store.CallFailed, Message: "error: x",
		Created: e.clock.Now(), Dispatched: e.clock.Now(), Webhook: "http://127.0.0.1:9/",
	}
	if err := s.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if got := PendingDeliveryIDs(t, s); !slices.Equal(got, []string{store.DeliveryID(c.ID, store.EventCompleted)}) {
		t.Fatalf("pending %v, want the completed delivery only", got)
	}
	recent, err := s.RecentCalls("", 10)
	if err != nil || len(recent) != 1 {
		t.Fatalf("RecentCalls: %v, %v", recent, err)
	}
	if recent[0].Webhook != "" {
		t.Errorf("RecentCalls shows the webhook URL %q; it may carry a token", recent[0].Webhook)
	}
}

// Each team has one webhook secret, drawn on first use, kept across a
// reopen and replaced only by a rotation.
func testWebhookSecretStableUntilRotated(t *testing.T, e *env) {
	s := e.open(t)
	if _, err := s.WebhookSecret("nobody", false); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("secret of an unknown team: %v, want ErrNotFound", err)
	}
	if _, err := s.EnsureTeam("acme"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnsureTeam("other"); err != nil {
		t.Fatal(err)
	}
	first, err := s.WebhookSecret("acme", false)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(first, "whsec_") {
		t.Errorf("secret %q lacks the whsec_ prefix", first)
	}
	s = e.reopen(t, s)
	if again, _ := s.WebhookSecret("acme", false); again != first {
		t.Errorf("secret changed across a reopen")
	}
	if o, _ := s.WebhookSecret("other", false); o == first {
		t.Errorf("two teams share a secret")
	}
	rotated, err := s.WebhookSecret("acme", true)
	if err != nil || rotated == first {
		t.Fatalf("rotate: %v (same secret: %v)", err, rotated == first)
	}
	if now, _ := s.WebhookSecret("acme", false); now != rotated {
		t.Errorf("after rotation the old secret is still returned")
	}
}
