package scheduler

import (
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
	"inferd/store/storetest"
)

// A PUT of idleTimeout takes effect at once, also for a replica that is
// already idle: its expiry follows the new setting, counted from when it went
// idle.
func TestIdleTimeoutChangeAppliesToReplicaAlreadyIdle(t *testing.T) {
	for _, tc := range []struct {
		name          string
		from, to      int
		stopsAt       time.Duration // since the replica went idle
		keptUntilLast time.Duration // still running this long after it went idle
	}{
		{"lowered", 600, 10, 10 * time.Second, 9 * time.Second},
		{"raised", 10, 600, 600 * time.Second, 599 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("idle", minMax(0, 1), idleTimeout(tc.from))
				h := newHarness(t, Config{}, nil, p)
				defer h.stop()
				c := h.submit(p, `{}`)
				i := h.launched()
				h.ready(i)
				h.call(i).reply(`{}`)
				h.result(c.ID)

				h.advance(time.Second)
				p.IdleTimeout = tc.to
				h.st.putProject(p)
				h.s.ProjectChanged(p.ID)
				h.settle()
				if got, want := h.project("idle").Replicas[0].IdleExpiry, h.clk.Now().Add(tc.stopsAt-time.Second); !got.Equal(want) {
					t.Errorf("idle expiry after the change = %v, want %v", got, want)
				}
				h.advance(tc.keptUntilLast - time.Second)
				if i.wasStopped() {
					t.Fatalf("replica stopped %v after going idle, before the new idleTimeout %ds", tc.keptUntilLast, tc.to)
				}
				h.advance(tc.stopsAt - tc.keptUntilLast)
				if !i.wasStopped() {
					t.Fatalf("replica still running %v after going idle with idleTimeout %ds", tc.stopsAt, tc.to)
				}
			})
		})
	}
}

// A change to any field of the model spec, one added later included,
// replaces the replicas started from the old spec: a new one boots from the
// new spec while the old one keeps serving, and the old one stops once the
// new one is ready. A change to a field that running replicas take as they
// are (the modelKey hash, concurrency, batch, bootTimeout, parkTimeout)
// keeps them.
func TestModelSpecFieldChangeReplacesOldReplicasUnlessLive(t *testing.T) {
	live := map[string]bool{"KeyHash": true, "Concurrency": true, "Batch": true, "BootTimeout": true, "ParkTimeout": true, "Aliases": true, "ServedModel": true}
	for _, field := range storetest.ModelSpecFields() {
		t.Run(field, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				p := testProject("v", minMax(1, 1), func(p *store.Project) {
					p.Model.Dir = "/srv/v"
					p.Model.Env = map[string]string{"A": "1"}
				})
				h := newHarness(t, Config{}, simulatedGPUs(2), p)
				defer h.stop()
				old := h.launched()
				h.ready(old)

				p.Model = storetest.ChangeModelSpecField(t, p.Model, field)
				h.st.putProject(p)
				h.s.ProjectChanged(p.ID)
				h.settle()
				if live[field] {
					if old.wasStopped() {
						t.Fatalf("a change to %s stopped the replica", field)
					}
					h.noLaunch()
					return
				}
				fresh := h.launched()
				if fresh.spec.Model.RestartNeeded(p.Model) {
					t.Errorf("the new replica runs %+v, want the changed spec %+v", fresh.spec.Model, p.Model)
				}
				if old.wasStopped() {
					t.Fatalf("a change to %s stopped the old replica before the new one was ready", field)
				}
				h.ready(fresh)
				if !old.wasStopped() {
					t.Fatalf("a change to %s left the old replica running beside the ready new one", field)
				}
			})
		})
	}
}

// A spec change that also lowers maxReplicas keeps only as many old
// replicas serving as new ones will come to replace them: the rest retire
// at once, and none serves the old spec for good.
func TestSpecChangeWithALowerMaxRetiresTheOldReplicasNoneWillReplace(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("v", minMax(3, 3), idleTimeout(600))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		old := h.launchedN(3)
		h.ready(old...)

		p.Model.Env = map[string]string{"V": "2"}
		p.MinReplicas, p.MaxReplicas = 1, 1
		h.st.putProject(p)
		h.s.ProjectChanged(p.ID)
		fresh := h.launched()
		h.noLaunch()
		if n := stoppedCount(old); n != 2 {
			t.Fatalf("%d old replicas stopped, want 2: one new replica will replace only one", n)
		}
		h.ready(fresh)
		if n := stoppedCount(old); n != 3 {
			t.Fatalf("%d old replicas stopped once the new one was ready, want all 3", n)
		}
		h.succeedOnNewReplicaAlready(fresh, h.submit(p, `{}`).ID)
	})
}

// succeedOnNewReplicaAlready has ready replica i answer call id, and checks
// that the call succeeded.
func (h *harness) succeedOnNewReplicaAlready(i *fakeInstance, id string) {
	h.t.Helper()
	h.call(i).reply(`{}`)
	if got := h.result(id); got.State != store.CallSucceeded {
		h.t.Fatalf("call %s = %+v", id, got)
	}
}
