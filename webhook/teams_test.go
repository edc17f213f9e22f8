package webhook

import (
	"context"
	"fmt"
	"net/http"
	"slices"
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

// The rules that span teams, each with two teams of two projects: acme
// (projects a1, a2) and beta (b1, b2).

// teamProjects are the projects of each team in these tests.
var teamProjects = map[string][2]string{"acme": {"a1", "a2"}, "beta": {"b1", "b2"}}

// saveCalls saves n finished calls of team, alternating its two projects,
// each with a webhook to url.
func saveCalls(t *testing.T, st store.Store, team string, n int, url string) {
	t.Helper()
	for i := range n {
		c := teamCall(team, teamProjects[team][i%2], fmt.Sprintf("call_%s%03d", team, i), url)
		if err := st.SaveCall(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
}

// arrivals returns when the messages to host arrived.
func (r *receiver) arrivals(host string) []time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	var at []time.Time
	for i, req := range r.got {
		if req.URL.Host == host {
			at = append(at, r.at[i])
		}
	}
	return at
}

// mostHeld returns the most hung requests held at once so far.
func (r *receiver) mostHeld() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.maxHeld
}

func hangsFor(host string) func(*http.Request) bool {
	return func(r *http.Request) bool { return r.URL.Host == host }
}

// #27's reproduction: one team's 80 messages to a receiver that never
// answers, then another team's. The slow team holds its share of the
// senders and no more; the other team's messages go at once.
func TestSlowTeamUsesOnlyItsShareOfSenders(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rcv := &receiver{hang: hangsFor("slow.example")}
		st, d := setup(t, Config{Senders: 8, SendersPerTeam: 3, Timeout: time.Minute, FirstRetry: time.Hour}, rcv)
		start := time.Now()
		saveCalls(t, st, "acme", 80, "http://slow.example/in")
		synctest.Wait()
		saveCalls(t, st, "beta", 2, "http://fast.example/in")
		synctest.Wait()

		if at := rcv.arrivals("fast.example"); len(at) != 2 || at[0] != start || at[1] != start {
			t.Errorf("beta's messages arrived at %v, want both at once (%v), not after acme's backlog", at, start)
		}
		if rcv.mostHeld() != 3 {
			t.Errorf("acme had %d attempts in flight at most, want its share, 3", rcv.mostHeld())
		}
		if s := d.Stats("acme"); s.Sending != 3 || s.Pending != 80 {
			t.Errorf("acme: %+v, want 3 sending of 80 pending", s)
		}
		if s := d.Stats("beta"); s.Delivered != 2 || s.Pending != 0 || s.Sending != 0 {
			t.Errorf("beta: %+v, want both delivered", s)
		}
	})
}

// When every sender is busy, the one freed next goes to the team with the
// fewest attempts in flight, not to the team whose messages are older.
func TestFreedSenderGoesToTheTeamWithFewestInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rcv := &receiver{hang: hangsFor("slow.example")}
		st, d := setup(t, Config{Senders: 4, SendersPerTeam: 4, Timeout: time.Minute, FirstRetry: time.Hour}, rcv)
		start := time.Now()
		saveCalls(t, st, "acme", 10, "http://slow.example/in")
		synctest.Wait()
		saveCalls(t, st, "beta", 1, "http://fast.example/in")
		synctest.Wait()
		if n := len(rcv.arrivals("fast.example")); n != 0 || rcv.mostHeld() != 4 {
			t.Fatalf("with acme holding every sender (%d), beta's message went anyway (%d)", rcv.mostHeld(), n)
		}
		time.Sleep(time.Minute) // acme's four attempts time out together
		synctest.Wait()
		if at := rcv.arrivals("fast.example"); len(at) != 1 || at[0] != start.Add(time.Minute) {
			t.Errorf("beta's message arrived at %v, want with the first freed sender, %v", at, start.Add(time.Minute))
		}
		if s := d.Stats("beta"); s.Delivered != 1 {
			t.Errorf("beta: %+v, want its message delivered", s)
		}
	})
}

// updates is a store that records every delivery update.
type updates struct {
	*memstore.Store
	mu  sync.Mutex
	got []store.Delivery
}

func (u *updates) UpdateDelivery(d store.Delivery) error {
	u.mu.Lock()
	u.got = append(u.got, d)
	u.mu.Unlock()
	return u.Store.UpdateDelivery(d)
}

// A team whose receiver always fails holds at most maxPendingPerTeam
// messages: beyond it, its oldest are dropped (ended unsent, saying why),
// and another team's messages are not touched.
func TestPendingCapDropsTheTeamsOldestMessagesOnly(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		mem := memstore.New(memstore.Options{})
		for team := range teamProjects {
			if _, err := mem.EnsureTeam(team); err != nil {
				t.Fatal(err)
			}
		}
		st := &updates{Store: mem}
		rcv := roundTripFunc(func(*http.Request) (*http.Response, error) {
			return &http.Response{StatusCode: 500, Body: http.NoBody, Header: http.Header{}}, nil
		})
		d := New(Config{Transport: rcv, MaxPendingPerTeam: 5, FirstRetry: time.Hour,
			Body: func(store.Call, store.Delivery) ([]byte, error) { return []byte(`{}`), nil }}, st, zerolog.Nop())
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(ctx) }()
		defer func() { cancel(); <-done; mem.Close() }()

		for i := range 8 {
			calls := []store.Call{teamCall("acme", teamProjects["acme"][i%2], fmt.Sprintf("call_acme%03d", i), "http://acme.example/in")}
			if i%2 == 0 { // beta: 4 in all, under the cap
				calls = append(calls, teamCall("beta", teamProjects["beta"][i%4/2], fmt.Sprintf("call_beta%03d", i), "http://beta.example/in"))
			}
			for _, c := range calls {
				if err := st.SaveCall(context.Background(), c); err != nil {
					t.Fatal(err)
				}
			}
			synctest.Wait()
			time.Sleep(time.Second) // each message a second younger than the last
		}

		var dropped []string
		st.mu.Lock()
		for _, u := range st.got {
			if !u.Ended.IsZero() {
				dropped = append(dropped, u.CallID)
				if u.Delivered || !strings.Contains(u.LastError, "dropped") || !strings.Contains(u.LastError, "webhook.maxPendingPerTeam (5)") {
					t.Errorf("%s ended %+v, want dropped, saying why", u.ID, u)
				}
			}
		}
		st.mu.Unlock()
		if want := []string{"call_acme000", "call_acme001", "call_acme002"}; !slices.Equal(dropped, want) {
			t.Errorf("dropped %v, want acme's three oldest %v", dropped, want)
		}
		pending, _ := mem.PendingDeliveries()
		byTeam := map[string]int{}
		for _, p := range pending {
			byTeam[p.TeamID]++
		}
		if byTeam["acme"] != 5 || byTeam["beta"] != 4 {
			t.Errorf("outbox holds %v, want acme 5 (its cap), beta 4", byTeam)
		}
		if a, b := d.Stats("acme"), d.Stats("beta"); a.Dropped != 3 || a.Pending != 5 || b.Dropped != 0 || b.Pending != 4 {
			t.Errorf("stats acme %+v, beta %+v", a, b)
		}
	})
}

// Each team's messages are signed with its own secret, for all its
// projects: a receiver of one team cannot verify the other's with its
// secret.
func TestMessagesAreSignedWithTheirTeamsSecret(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rcv := &receiver{}
		st, _ := setup(t, Config{}, rcv)
		saveCalls(t, st, "acme", 2, "http://acme.example/in")
		saveCalls(t, st, "beta", 2, "http://beta.example/in")
		synctest.Wait()
		secrets := map[string]string{}
		for team := range teamProjects {
			secrets[team], _ = st.WebhookSecret(team, false)
		}
		if rcv.count() != 4 || secrets["acme"] == secrets["beta"] {
			t.Fatalf("%d messages; secrets %v", rcv.count(), secrets)
		}
		projects := map[string]bool{}
		for i, req := range rcv.got {
			team, other := "acme", "beta"
			if req.URL.Host == "beta.example" {
				team, other = "beta", "acme"
			}
			c, err := st.GetCall(strings.TrimSuffix(strings.Replace(req.Header.Get("webhook-id"), "msg_", "call_", 1), "_completed"))
			if err != nil || c.TeamID != team {
				t.Fatalf("message %s: call %+v, %v", req.Header.Get("webhook-id"), c, err)
			}
			projects[c.ProjectID] = true
			verify(t, secrets[team], rcv, i)
			if err := testenv.VerifyStandardWebhook(secrets[other], req.Header, rcv.bodies[i], rcv.at[i]); err == nil {
				t.Errorf("%s's message %s verifies with %s's secret", team, req.Header.Get("webhook-id"), other)
			}
		}
		if len(projects) != 4 {
			t.Errorf("messages of projects %v, want all four", projects)
		}
	})
}
