package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

func team(id string) func(*store.Project) {
	return func(p *store.Project) { p.TeamID = id }
}

// quotaHarness starts a harness whose store holds the given team quotas.
func quotaHarness(t *testing.T, gpus Inventory, quotas map[string]store.Quota, projects ...store.Project) *harness {
	st := newTestStore(t, projects...)
	for id, q := range quotas {
		if _, err := st.SetTeamQuota(id, q); err != nil {
			t.Fatal(err)
		}
	}
	return startHarness(t, Config{}, gpus, st)
}

func TestTeamAtItsGPUQuotaWaitsWhileAnotherTeamUsesFreeGPUs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", team("acme"), minMax(0, 3), wholeGPUs(1))
		b := testProject("b", team("labs"), minMax(0, 1), wholeGPUs(1))
		h := quotaHarness(t, simulatedGPUs(3), map[string]store.Quota{"acme": {GPUs: 1}}, a, b)
		defer h.stop()
		h.submit(a, `{}`)
		h.submit(a, `{}`)
		ia := h.launched()
		h.noLaunch() // a second GPU would go beyond acme's quota, though two are free
		if got := h.project("a").Waiting; got != "waiting: team acme is at its gpus quota (1)" {
			t.Errorf("a waiting = %q", got)
		}
		h.submit(b, `{}`)
		if ib := h.launched(); ib.spec.ProjectID != "b" {
			t.Fatalf("launched %s, want b's replica", ib.spec.ReplicaID)
		}
		if ia.wasStopped() {
			t.Error("acme's replica was stopped")
		}
		st := h.s.Snapshot()
		if len(st.Teams) != 2 || st.Teams[0].ID != "acme" || st.Teams[0].GPUs != 1 || st.Teams[0].Quota.GPUs != 1 || st.Teams[0].QueuedCalls != 2 {
			t.Errorf("teams = %+v", st.Teams)
		}

		// Raising the quota lets acme's second replica boot.
		if _, err := h.st.SetTeamQuota("acme", store.Quota{GPUs: 2}); err != nil {
			t.Fatal(err)
		}
		h.s.TeamChanged("acme")
		if i := h.launched(); i.spec.ProjectID != "a" {
			t.Errorf("launched %s after the quota rose, want a's", i.spec.ReplicaID)
		}
	})
}

func TestTeamQuotaRefusesCallsBeyondItsQueue(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quota store.Quota
		want  string
	}{
		{"queued calls", store.Quota{QueuedCalls: 2, Replicas: 1}, "team acme is at its queuedCalls quota (2); retry later"},
		{"queued bytes", store.Quota{QueuedBytes: 40, Replicas: 1}, "team acme is at its queuedBytes quota (40); retry later"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := testProject("a", team("acme"), minMax(0, 1))
				a2 := testProject("a2", team("acme"), minMax(0, 1))
				b := testProject("b", team("labs"), minMax(0, 1))
				h := quotaHarness(t, cpuSlots(8), map[string]store.Quota{"acme": tc.quota}, a, a2, b)
				defer h.stop()
				h.submit(a, `{"n": 1}`) // runs once its replica is up; the rest queue
				h.ready(h.launched())
				h.submit(a, `{"n": "2 ......"}`)
				h.submit(a2, `{"n": "3 ......"}`) // the quota is the team's: a2 counts too
				_, err := h.s.Submit(context.Background(), a2, json.RawMessage(`{"n": "4 ......"}`))
				if !errors.Is(err, ErrTeamQuota) || err.Error() != tc.want {
					t.Fatalf("Submit over the quota = %v, want %q", err, tc.want)
				}
				h.submit(b, `{"n": 5}`) // another team queues as before
			})
		})
	}
}

func TestTeamAtItsRunningCallsQuotaQueues(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", team("acme"), minMax(1, 1), concurrency(4))
		h := quotaHarness(t, cpuSlots(2), map[string]store.Quota{"acme": {RunningCalls: 1}}, a)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.submit(a, `{}`)
		c2 := h.submit(a, `{}`)
		fc := h.call(i)
		h.noCall(i)
		if ps := h.project("a"); ps.Running != 1 || ps.Queued != 1 || !strings.Contains(ps.Waiting, "runningCalls quota (1)") {
			t.Errorf("a = running %d queued %d waiting %q", ps.Running, ps.Queued, ps.Waiting)
		}
		fc.reply(`{}`)
		h.settle()
		h.call(i).reply(`{}`)
		if got := h.result(c2.ID); got.State != store.CallSucceeded {
			t.Errorf("second call = %s %q", got.State, got.Message)
		}
	})
}

// In a cluster a node holds a team to its share of the team's quotas
// (Config.TeamShare): with a share of none it runs nothing of a field the
// quota bounds, and boots nothing; a larger share, told by
// TeamShareChanged, lets the waiting call run at once; the status says
// the share in force with its record's revision, and what the team wants.
func TestTeamIsHeldToThisNodesShareOfItsQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var mu sync.Mutex
		share, rev := store.Quota{}, int64(0)
		a := testProject("a", team("acme"), minMax(1, 1), concurrency(4))
		st := newTestStore(t, a)
		if _, err := st.SetTeamQuota("acme", store.Quota{RunningCalls: 3}); err != nil {
			t.Fatal(err)
		}
		h := startHarness(t, Config{TeamShare: func(string) (store.Quota, int64) {
			mu.Lock()
			defer mu.Unlock()
			return share, rev
		}}, cpuSlots(2), st)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		h.submit(a, `{}`)
		h.submit(a, `{}`)
		h.noCall(i)
		if ps := h.project("a"); ps.Running != 0 || !strings.Contains(ps.Waiting, "runningCalls quota (3; this node's share 0)") {
			t.Errorf("with no share: a = running %d waiting %q", ps.Running, ps.Waiting)
		}
		mu.Lock()
		share, rev = store.Quota{RunningCalls: 1}, 7
		mu.Unlock()
		h.s.TeamShareChanged("acme")
		fc := h.call(i)
		h.noCall(i)
		teams := h.s.Snapshot().Teams
		if len(teams) != 1 || teams[0].Share == nil || teams[0].Share.RunningCalls != 1 || teams[0].ShareRev != 7 ||
			teams[0].Want == nil || teams[0].Want.RunningCalls != 2 || teams[0].RunningCalls != 1 {
			t.Errorf("teams = %+v; want acme's share 1 (rev 7), want 2, running 1", teams)
		}
		fc.reply(`{}`)
		h.call(i).reply(`{}`)
	})
}

func TestFairShareEvictsTheOverShareTeamsIdleReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// Three CPU slots: acme holds two idle replicas, ops one (the least
		// recently used of all), and labs none while its call waits. Shares
		// are one slot each: acme is above its share, ops at it, labs below.
		a := testProject("a", team("acme"), minMax(0, 2), idleTimeout(600))
		o := testProject("o", team("ops"), minMax(0, 1), idleTimeout(600))
		b := testProject("b", team("labs"), minMax(0, 1))
		h := quotaHarness(t, cpuSlots(3), nil, a, o, b)
		defer h.stop()
		h.submit(o, `{}`)
		io := h.launched()
		h.ready(io)
		h.call(io).reply(`{}`) // o idle first: least recently used
		h.advance(time.Second)
		h.submit(a, `{}`)
		h.submit(a, `{}`)
		as := h.launchedN(2)
		h.ready(as...)
		h.call(as[0]).reply(`{}`)
		h.call(as[1]).reply(`{}`)
		h.advance(time.Second)

		h.submit(b, `{}`)
		if io.wasStopped() {
			t.Error("ops's replica, at its fair share, was evicted")
		}
		if stoppedCount(as) != 1 {
			t.Fatalf("%d of acme's replicas stopped, want 1 (acme is above its share)", stoppedCount(as))
		}
		if i := h.launched(); i.spec.ProjectID != "b" {
			t.Errorf("launched %s, want b's replica", i.spec.ReplicaID)
		}
	})
}

func TestTeamBelowItsShareDoesNotEvictAnotherTeamAtItsShare(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", team("acme"), minMax(0, 1), idleTimeout(600))
		b := testProject("b", team("labs"), minMax(0, 2))
		h := quotaHarness(t, cpuSlots(2), nil, a, b)
		defer h.stop()
		h.submit(a, `{}`)
		ia := h.launched()
		h.ready(ia)
		h.call(ia).reply(`{}`)
		h.submit(b, `{}`)
		ib := h.launched()
		h.ready(ib)
		h.call(ib)        // busy
		h.submit(b, `{}`) // labs wants a second slot: it holds its share already
		h.noLaunch()
		if ia.wasStopped() {
			t.Error("acme's only replica was evicted for a team at its share")
		}
	})
}

func TestTeamAtItsReplicaQuotaWaitsForItsOwnReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", team("acme"), minMax(0, 1), idleTimeout(60))
		a2 := testProject("a2", team("acme"), minMax(0, 1))
		b := testProject("b", team("labs"), minMax(0, 1))
		h := quotaHarness(t, cpuSlots(4), map[string]store.Quota{"acme": {Replicas: 1}}, a, a2, b)
		defer h.stop()
		h.submit(a, `{}`)
		ia := h.launched()
		h.ready(ia)
		h.call(ia).reply(`{}`)
		c := h.submit(a2, `{}`)
		h.noLaunch() // acme's one replica is a's, idle but within its idleTimeout
		if got := h.project("a2").Waiting; got != "waiting: team acme is at its replicas quota (1)" {
			t.Errorf("a2 waiting = %q", got)
		}
		h.submit(b, `{}`)
		if i := h.launched(); i.spec.ProjectID != "b" {
			t.Fatalf("launched %s, want b's", i.spec.ReplicaID)
		}
		h.advance(60 * time.Second) // a's idle replica stops: acme's room is a2's
		if !ia.wasStopped() {
			t.Fatal("a's idle replica was not stopped at its idle timeout")
		}
		i := h.launched()
		if i.spec.ProjectID != "a2" {
			t.Fatalf("launched %s, want a2's", i.spec.ReplicaID)
		}
		h.serveOne(i)
		if got := h.result(c.ID); got.State != store.CallSucceeded {
			t.Errorf("a2's call = %s %q", got.State, got.Message)
		}
	})
}
