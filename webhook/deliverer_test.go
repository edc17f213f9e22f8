package webhook

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
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

	"inferd/store"
	"inferd/store/memstore"
)

// receiver is a fake destination: it answers the statuses it is given in
// turn (200 once they run out) and records what it got, when.
type receiver struct {
	mu       sync.Mutex
	statuses []int
	got      []*http.Request
	bodies   [][]byte
	at       []time.Time
}

func (r *receiver) RoundTrip(req *http.Request) (*http.Response, error) {
	body, _ := io.ReadAll(req.Body)
	r.mu.Lock()
	defer r.mu.Unlock()
	r.got = append(r.got, req)
	r.bodies = append(r.bodies, body)
	r.at = append(r.at, time.Now())
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

// setup returns a store with team acme and a deliverer over it, running
// until the test ends.
func setup(t *testing.T, cfg Config, rcv *receiver) (*memstore.Store, *Deliverer) {
	st := memstore.New(memstore.Options{})
	if _, err := st.EnsureTeam("acme"); err != nil {
		t.Fatal(err)
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
	now := time.Now()
	return store.Call{
		ID: id, ProjectID: "p", TeamID: "acme", State: store.CallSucceeded, Message: "success",
		Created: now, Dispatched: now, Finished: now, Webhook: "http://hooks.example/in",
	}
}

// verify checks a message's signature with its own HMAC, independent of
// Sign.
func verify(t *testing.T, secret string, req *http.Request, body []byte) {
	t.Helper()
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	io.WriteString(mac, req.Header.Get("webhook-id")+"."+req.Header.Get("webhook-timestamp")+".")
	mac.Write(body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	if got := req.Header.Get("webhook-signature"); got != want {
		t.Errorf("webhook-signature %q, want %q", got, want)
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
			verify(t, secret, req, rcv.bodies[i])
		}
		if s := d.Stats(""); s.Delivered != 1 || s.Retries != 2 || s.GaveUp != 0 || s.Pending != 0 {
			t.Errorf("stats %+v, want 1 delivered after 2 retries", s)
		}
		if p, _ := st.PendingDeliveries(); len(p) != 0 {
			t.Errorf("outbox still holds %v", p)
		}
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
