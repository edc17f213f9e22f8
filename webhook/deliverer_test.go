package webhook

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"inferd/internal/testenv"
	"inferd/store"
	"inferd/store/memstore"
)

// receiver is a fake destination: it answers the statuses it is given in
// turn (200 once they run out) and records what it got, when. A request
// that hang picks is held until its attempt's deadline instead, as by a
// receiver that never answers.
type receiver struct {
	mu       sync.Mutex
	statuses []int
	hang     func(*http.Request) bool
	got      []*http.Request
	bodies   [][]byte
	at       []time.Time
	holding  int // hung requests held now
	maxHeld  int // the most held at once
}

func (r *receiver) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	r.got = append(r.got, req)
	r.bodies = append(r.bodies, body)
	r.at = append(r.at, time.Now())
	if r.hang != nil && r.hang(req) {
		r.holding++
		r.maxHeld = max(r.maxHeld, r.holding)
		r.mu.Unlock()
		<-req.Context().Done()
		r.mu.Lock()
		r.holding--
		r.mu.Unlock()
		return nil, req.Context().Err()
	}
	defer r.mu.Unlock()
	status := 200
	if len(r.statuses) > 0 {
		status, r.statuses = r.statuses[0], r.statuses[1:]
	}
	return &http.Response{StatusCode: status, Body: io.NopCloser(strings.NewReader("")), Header: http.Header{}}, nil
}

func (r *receiver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

// setup returns a store with teams acme and beta and a deliverer over it,
// running until the test ends.
func setup(t *testing.T, cfg Config, rcv http.RoundTripper) (*memstore.Store, *Deliverer) {
	st := memstore.New(memstore.Options{})
	for _, team := range []string{"acme", "beta"} {
		if _, err := st.EnsureTeam(team); err != nil {
			t.Fatal(err)
		}
	}
	cfg.Transport = rcv
	cfg.Body = func(c store.Call, d store.Delivery) ([]byte, error) {
		return json.Marshal(map[string]string{"callID": c.ID, "event": d.Event, "message": c.Message})
	}
	d := New(cfg, st, zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		st.Close()
	})
	return st, d
}

func finishedCall(id string) store.Call {
	return teamCall("acme", "p", id, "http://hooks.example/in")
}

// teamCall is a finished call of team's project with a webhook to url.
func teamCall(team, project, id, url string) store.Call {
	now := time.Now()
	return store.Call{
		ID: id, ProjectID: project, TeamID: team, State: store.CallSucceeded, Message: "success",
		Created: now, Dispatched: now, Finished: now, Webhook: url,
	}
}

// verify checks the i-th message rcv got as a Standard Webhooks receiver
// does when it arrives: signed over id.timestamp.body with the secret, and
// stamped with the current Unix time.
func verify(t *testing.T, secret string, rcv *receiver, i int) {
	t.Helper()
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	if err := testenv.VerifyStandardWebhook(secret, rcv.got[i].Header, rcv.bodies[i], rcv.at[i]); err != nil {
		t.Errorf("message %d (%s): %v", i+1, rcv.got[i].Header.Get("webhook-id"), err)
	}
}

func TestFailedDeliveriesAreRetriedWithBackoffUnderOneID(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rcv := &receiver{statuses: []int{500, 503}}
		st, d := setup(t, Config{FirstRetry: 10 * time.Second}, rcv)
		start := time.Now()
		if err := st.SaveCall(context.Background(), finishedCall("call_one")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Minute) // the bubble's fake clock
		synctest.Wait()
		if rcv.count() != 3 {
			t.Fatalf("%d attempts, want 3", rcv.count())
		}
		secret, _ := st.WebhookSecret("acme", false)
		wantAt := []time.Duration{0, 10 * time.Second, 30 * time.Second}
		for i, req := range rcv.got {
			if id := req.Header.Get("webhook-id"); id != store.DeliveryID("call_one", store.EventCompleted) {
				t.Errorf("attempt %d: webhook-id %q", i+1, id)
			}
			if at := rcv.at[i].Sub(start).Round(time.Second); at != wantAt[i] {
				t.Errorf("attempt %d at +%v, want +%v", i+1, at, wantAt[i])
			}
			verify(t, secret, rcv, i)
		}
		if s := d.Stats(""); s.Delivered != 1 || s.Retries != 2 || s.GaveUp != 0 || s.Pending != 0 {
			t.Errorf("stats %+v, want 1 delivered after 2 retries", s)
		}
		if p, _ := st.PendingDeliveries(); len(p) != 0 {
			t.Errorf("outbox still holds %v", p)
		}
	})
}

// A spec-following receiver refuses a message stamped more than a few
// minutes from its clock: a retry long after the message was queued
// carries the time of its own attempt, and is still accepted.
func TestRetryIsStampedWithTheTimeOfItsAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rcv := &receiver{statuses: []int{503}}
		st, _ := setup(t, Config{FirstRetry: 20 * time.Minute}, rcv)
		if err := st.SaveCall(context.Background(), finishedCall("call_late")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		if rcv.count() != 2 {
			t.Fatalf("%d attempts, want 2", rcv.count())
		}
		if gap := rcv.at[1].Sub(rcv.at[0]); gap != 20*time.Minute {
			t.Fatalf("retry after %v, want 20m", gap)
		}
		secret, _ := st.WebhookSecret("acme", false)
		verify(t, secret, rcv, 0)
		verify(t, secret, rcv, 1)
	})
}

func TestDeliveryIsGivenUpAfterRetryFor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rcv := &receiver{statuses: []int{500, 500, 500, 500, 500, 500, 500}}
		st, d := setup(t, Config{FirstRetry: time.Minute, RetryFor: 5 * time.Minute}, rcv)
		if err := st.SaveCall(context.Background(), finishedCall("call_two")); err != nil {
			t.Fatal(err)
		}
		time.Sleep(time.Hour)
		synctest.Wait()
		// Attempts at 0, 1m, 3m; the next would be at 7m, past 5m.
		if n := rcv.count(); n != 3 {
			t.Errorf("%d attempts, want 3", n)
		}
		if s := d.Stats(""); s.GaveUp != 1 || s.Delivered != 0 || s.Pending != 0 {
			t.Errorf("stats %+v, want one given up", s)
		}
		if p, _ := st.PendingDeliveries(); len(p) != 0 {
			t.Errorf("outbox still holds %v", p)
		}
	})
}

func TestDeliveriesQueuedBeforeARestartAreSent(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		first := memstore.New(memstore.Options{})
		if _, err := first.EnsureTeam("acme"); err != nil {
			t.Fatal(err)
		}
		if err := first.SaveCall(context.Background(), finishedCall("call_three")); err != nil {
			t.Fatal(err)
		}
		st := first.Reopen() // no deliverer ever ran on first
		rcv := &receiver{}
		d := New(Config{Transport: rcv, Body: func(store.Call, store.Delivery) ([]byte, error) { return []byte(`{}`), nil }}, st, zerolog.Nop())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		synctest.Wait()
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		st.Close()
		if rcv.count() != 1 || d.Stats("").Delivered != 1 {
			t.Errorf("%d sent, stats %+v; want the stored message delivered", rcv.count(), d.Stats(""))
		}
	})
}

func TestRefusedDestinationIsGivenUpAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		refusing := roundTripFunc(func(*http.Request) (*http.Response, error) {
			return nil, fmt.Errorf("dial: %w", ErrRefused)
		})
		st := memstore.New(memstore.Options{})
		defer st.Close()
		if _, err := st.EnsureTeam("acme"); err != nil {
			t.Fatal(err)
		}
		d := New(Config{Transport: refusing, Body: func(store.Call, store.Delivery) ([]byte, error) { return []byte(`{}`), nil }}, st, zerolog.Nop())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		if err := st.SaveCall(context.Background(), finishedCall("call_four")); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		cancel()
		<-done
		if s := d.Stats(""); s.GaveUp != 1 || s.Retries != 0 {
			t.Errorf("stats %+v, want given up without retries", s)
		}
	})
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// outboxOutage is the store as a node of a cluster without quorum sees it
// at start-up: its first reads of the outbox find etcd unavailable.
type outboxOutage struct {
	*memstore.Store
	mu    sync.Mutex
	fails int
}

func (s *outboxOutage) PendingDeliveries() ([]store.Delivery, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fails > 0 {
		s.fails--
		return nil, fmt.Errorf("pending deliveries: etcd: %w", store.ErrUnavailable)
	}
	return s.Store.PendingDeliveries()
}

// A deliverer that starts while the store is unavailable waits it out
// (losing quorum never ends the node) and then sends what the outbox held.
func TestDelivererWaitsOutAnUnavailableStoreAtStart(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(memstore.Options{})
		defer mem.Close()
		if _, err := mem.EnsureTeam("acme"); err != nil {
			t.Fatal(err)
		}
		if err := mem.SaveCall(context.Background(), finishedCall("call_before")); err != nil {
			t.Fatal(err)
		}
		st := &outboxOutage{Store: mem, fails: 3}
		rcv := &receiver{}
		d := New(Config{Transport: rcv, Body: func(c store.Call, dl store.Delivery) ([]byte, error) { return []byte(`{}`), nil }},
			st, zerolog.Nop())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		time.Sleep(time.Minute) // the bubble's clock: past the outage
		synctest.Wait()
		select {
		case err := <-done:
			t.Fatalf("Run ended with %v; want it to wait out the outage", err)
		default:
		}
		if rcv.count() != 1 {
			t.Errorf("%d messages sent after the outage; want the one the outbox held", rcv.count())
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
}
