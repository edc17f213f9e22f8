package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// The rules that span teams and projects, each with two teams of two
// projects: acme (a1, a2) and labs (b1, b2). A rule kept per project, or
// one team's state leaking into another's, fails these.

// twoTeams returns acme's a1, a2 and labs's b1, b2, each with opts.
func twoTeams(opts ...func(*store.Project)) (a1, a2, b1, b2 store.Project) {
	mk := func(id, t string) store.Project {
		return testProject(id, append([]func(*store.Project){team(t)}, opts...)...)
	}
	return mk("a1", "acme"), mk("a2", "acme"), mk("b1", "labs"), mk("b2", "labs")
}

// TestIdempotencyKeysAreEachTeamsOwn: one idempotency key used by two teams
// names two calls. Team labs is never told "idempotencyKey reused" for, nor
// given, acme's call, while that call is live (in the scheduler's index), once
// it is only in the store, and after a restart recovers it; within a team the
// key spans its projects.
func TestIdempotencyKeysAreEachTeamsOwn(t *testing.T) {
	start := func(t *testing.T, h *harness, p store.Project, inputs string) (store.Call, error) {
		t.Helper()
		c, err := h.s.Start(context.Background(), p, Request{Inputs: json.RawMessage(inputs), IdempotencyKey: "order-42"})
		h.settle()
		return c, err
	}
	// check starts labs's call under acme's key: its own, new, call; and
	// its repeat, and acme's, each find their team's.
	check := func(t *testing.T, h *harness, acmeCall store.Call) {
		t.Helper()
		a1, a2, b1, b2 := twoTeams()
		labs, err := start(t, h, b1, `{"x": 2}`)
		if err != nil || labs.ID == acmeCall.ID || labs.TeamID != "labs" {
			t.Fatalf("labs's start under acme's key = %+v, %v; want a new call of labs", labs, err)
		}
		if again, err := start(t, h, b1, `{"x": 2}`); err != nil || again.ID != labs.ID {
			t.Errorf("labs's repeat = %s, %v; want its own call %s", again.ID, err, labs.ID)
		}
		if _, err := start(t, h, b2, `{"x": 2}`); !errors.Is(err, ErrIdempotencyMismatch) {
			t.Errorf("labs's key on its other project = %v; want ErrIdempotencyMismatch (a key is the team's)", err)
		}
		if again, err := start(t, h, a1, `{"x": 1}`); err != nil || again.ID != acmeCall.ID {
			t.Errorf("acme's repeat = %s, %v; want its call %s", again.ID, err, acmeCall.ID)
		}
		if _, err := start(t, h, a2, `{"x": 1}`); !errors.Is(err, ErrIdempotencyMismatch) {
			t.Errorf("acme's key on its other project = %v; want ErrIdempotencyMismatch", err)
		}
	}

	t.Run("live", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a1, a2, b1, b2 := twoTeams()
			h := newHarness(t, Config{}, cpuSlots(0), a1, a2, b1, b2) // nothing runs: acme's call stays live
			defer h.stop()
			acme, err := start(t, h, a1, `{"x": 1}`)
			if err != nil {
				t.Fatal(err)
			}
			check(t, h, acme)
		})
	})
	t.Run("finished", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a1, a2, b1, b2 := twoTeams()
			h := newHarness(t, Config{}, nil, a1, a2, b1, b2)
			defer h.stop()
			acme, err := start(t, h, a1, `{"x": 1}`)
			if err != nil {
				t.Fatal(err)
			}
			h.serveOne(h.launched())
			if got := h.result(acme.ID); got.State != store.CallSucceeded {
				t.Fatalf("acme's call = %s", got.State)
			}
			check(t, h, acme)
		})
	})
	t.Run("after a restart", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a1, a2, b1, b2 := twoTeams()
			st := newTestStore(t, a1, a2, b1, b2)
			inputs := json.RawMessage(`{"x": 1}`)
			st.putCall(store.Call{ID: "call_acme", ProjectID: "a1", TeamID: "acme", State: store.CallQueued,
				Created: time.Now(), Inputs: inputs, IdempotencyKey: "order-42", RequestHash: store.RequestHash("a1", inputs)})
			h := startHarness(t, Config{}, cpuSlots(0), st) // recovers acme's call, queued
			defer h.stop()
			check(t, h, store.Call{ID: "call_acme"})
		})
	})
}

// TestTeamQuotasCountEveryProjectOfTheTeam: each team quota is the sum over
// the team's projects: acme, at its quota through a1, holds a2 back, while
// labs, with the same quota spread over b1 and b2, is not held by acme's use.
func TestTeamQuotasCountEveryProjectOfTheTeam(t *testing.T) {
	for _, tc := range []struct {
		name    string
		quota   store.Quota
		gpus    Inventory
		opts    []func(*store.Project)
		waiting string
	}{
		{"replicas", store.Quota{Replicas: 1}, cpuSlots(8), nil, "waiting: team acme is at its replicas quota (1)"},
		{"cpuSlots", store.Quota{CPUSlots: 1}, cpuSlots(8), nil, "waiting: team acme is at its cpuSlots quota (1)"},
		{"gpus", store.Quota{GPUs: 1}, simulatedGPUs(4), []func(*store.Project){wholeGPUs(1)}, "waiting: team acme is at its gpus quota (1)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a1, a2, b1, b2 := twoTeams(append([]func(*store.Project){minMax(0, 1)}, tc.opts...)...)
				// labs's quota is twice acme's: one replica for each of its projects.
				double := store.Quota{Replicas: 2 * tc.quota.Replicas, CPUSlots: 2 * tc.quota.CPUSlots, GPUs: 2 * tc.quota.GPUs}
				h := quotaHarness(t, tc.gpus, map[string]store.Quota{"acme": tc.quota, "labs": double}, a1, a2, b1, b2)
				defer h.stop()
				h.submit(a1, `{}`)
				if i := h.launched(); i.spec.ProjectID != "a1" {
					t.Fatalf("launched %s, want a1's", i.spec.ReplicaID)
				}
				c := h.submit(a2, `{}`)
				h.noLaunch() // a2's replica would take acme beyond its quota, held by a1
				if got := h.project("a2").Waiting; got != tc.waiting {
					t.Errorf("a2 waiting = %q, want %q", got, tc.waiting)
				}
				h.submit(b1, `{}`)
				h.submit(b2, `{}`)
				got := map[string]bool{}
				for _, i := range h.launchedN(2) {
					got[i.spec.ProjectID] = true
				}
				if !got["b1"] || !got["b2"] {
					t.Errorf("labs launched %v, want b1 and b2 (acme's use is not labs's)", got)
				}
				if h.state(c.ID) != store.CallQueued {
					t.Errorf("a2's call = %s, want queued", h.state(c.ID))
				}
			})
		})
	}
}

// TestRunningCallsQuotaCountsEveryProjectOfTheTeam: acme's runningCalls
// quota of 1 holds a2's call while a1's runs, though a2 has a ready replica
// of its own; labs, at a quota of 2, runs on b1 and b2 at once; a2's call
// runs once a1's ends.
func TestRunningCallsQuotaCountsEveryProjectOfTheTeam(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a1, a2, b1, b2 := twoTeams(minMax(1, 1))
		h := quotaHarness(t, cpuSlots(4), map[string]store.Quota{
			"acme": {RunningCalls: 1}, "labs": {RunningCalls: 2}}, a1, a2, b1, b2)
		defer h.stop()
		reps := map[string]*fakeInstance{}
		for _, i := range h.launchedN(4) {
			reps[i.spec.ProjectID] = i
		}
		h.ready(reps["a1"], reps["a2"], reps["b1"], reps["b2"])
		h.submit(a1, `{}`)
		fa1 := h.call(reps["a1"])
		c2 := h.submit(a2, `{}`)
		h.noCall(reps["a2"])
		if got := h.project("a2").Waiting; !strings.Contains(got, "team acme is at its runningCalls quota (1)") {
			t.Errorf("a2 waiting = %q", got)
		}
		h.submit(b1, `{}`)
		h.submit(b2, `{}`)
		h.call(reps["b1"]).reply(`{}`)
		h.call(reps["b2"]).reply(`{}`)

		fa1.reply(`{}`)
		h.settle()
		h.call(reps["a2"]).reply(`{}`)
		if got := h.result(c2.ID); got.State != store.CallSucceeded {
			t.Errorf("a2's call = %s %q", got.State, got.Message)
		}
	})
}

// TestQueuedQuotasCountEveryProjectOfTheTeam: acme's queued calls and bytes
// are summed over a1 and a2; labs queues on b1 and b2 as its own quota allows.
func TestQueuedQuotasCountEveryProjectOfTheTeam(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quota store.Quota
		want  string
	}{
		{"queued calls", store.Quota{QueuedCalls: 2}, "team acme is at its queuedCalls quota (2); retry later"},
		{"queued bytes", store.Quota{QueuedBytes: 34}, "team acme is at its queuedBytes quota (34); retry later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a1, a2, b1, b2 := twoTeams()
				h := quotaHarness(t, cpuSlots(0), map[string]store.Quota{"acme": tc.quota, "labs": tc.quota}, a1, a2, b1, b2)
				defer h.stop()
				h.submit(a1, `{"n": "1 ......"}`) // 17 bytes: nothing runs, all queue
				h.submit(a2, `{"n": "2 ......"}`)
				for _, p := range []store.Project{a1, a2} {
					_, err := h.s.Submit(context.Background(), p, json.RawMessage(`{"n": "3 ......"}`))
					if !errors.Is(err, ErrTeamQuota) || err.Error() != tc.want {
						t.Errorf("a third call on %s = %v, want %q", p.ID, err, tc.want)
					}
				}
				h.submit(b1, `{"n": "4 ......"}`) // labs's quota is its own
				h.submit(b2, `{"n": "5 ......"}`)
			})
		})
	}
}

// TestFairShareCountsEveryProjectOfATeam: a team's share of the box is what
// all its projects hold.
func TestFairShareCountsEveryProjectOfATeam(t *testing.T) {
	t.Run("a team above its share across projects gives way", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Three slots: acme holds two idle replicas, one each of a1
			// and a2 (no one project above a share of one and a half);
			// labs holds b1's, busy, and b2's call waits.
			a1, a2, b1, b2 := twoTeams(minMax(0, 1), idleTimeout(600))
			h := quotaHarness(t, cpuSlots(3), nil, a1, a2, b1, b2)
			defer h.stop()
			acme := idleReplicas(h, a1, a2)
			h.submit(b1, `{}`)
			ib := h.launched()
			h.ready(ib)
			h.call(ib) // busy
			h.submit(b2, `{}`)
			if stoppedCount(acme) != 1 {
				t.Fatalf("%d of acme's replicas stopped, want 1: acme holds two slots of three between two teams", stoppedCount(acme))
			}
			if i := h.launched(); i.spec.ProjectID != "b2" {
				t.Errorf("launched %s, want b2's", i.spec.ReplicaID)
			}
		})
	})
	t.Run("a team at its share across projects evicts nobody", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			// Five slots among three teams: acme holds two idle (a1, a2),
			// labs two busy on b1 while b2's call waits, ops one busy.
			// labs is above its share (5/3) though b2 holds nothing.
			a1, a2, b1, b2 := twoTeams(minMax(0, 2), idleTimeout(600))
			o := testProject("o", team("ops"), minMax(0, 1))
			h := quotaHarness(t, cpuSlots(5), nil, a1, a2, b1, b2, o)
			defer h.stop()
			acme := idleReplicas(h, a1, a2)
			h.submit(b1, `{}`)
			h.submit(b1, `{}`)
			labs := h.launchedN(2)
			h.ready(labs...)
			h.call(labs[0])
			h.call(labs[1])
			h.submit(o, `{}`)
			io := h.launched()
			h.ready(io)
			h.call(io)
			h.submit(b2, `{}`)
			h.noLaunch()
			if n := stoppedCount(acme); n != 0 {
				t.Errorf("%d of acme's idle replicas evicted for labs, which is above its share", n)
			}
		})
	})
}

// idleReplicas boots one replica of each project, serves one call on each and
// returns them idle.
func idleReplicas(h *harness, ps ...store.Project) []*fakeInstance {
	var out []*fakeInstance
	for _, p := range ps {
		h.submit(p, `{}`)
		i := h.launched()
		h.ready(i)
		h.call(i).reply(`{}`)
		out = append(out, i)
	}
	h.advance(time.Second)
	return out
}
