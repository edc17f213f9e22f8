package scheduler

import (
	"reflect"
	"testing"
	"testing/synctest"

	"inferd/store"
)

// TestCallOfAProjectHeldOutByMinimumsSaysWhy: three CPU projects on two
// CPU slots, two with minReplicas 1 (one of them another team's), leave the
// third no slot for good: its queued call stays "queued" (a pending message
// is the state name) and says why in WaitingFor, as its status does, in a
// text that names no project and a Named one that names the holders with
// their teams (for the callers who may see them); once a minimum is
// lowered the slot comes free and the reason goes.
func TestCallOfAProjectHeldOutByMinimumsSaysWhy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", minMax(1, 1))
		b := testProject("b", team("labs"), minMax(1, 1))
		c := testProject("c", minMax(0, 1))
		h := newHarness(t, Config{}, cpuSlots(2), a, b, c)
		defer h.stop()
		h.ready(h.launchedN(2)...)
		call := h.submit(c, `{}`)
		h.noLaunch()
		h.settle()
		got, _, err := h.s.Lookup(call.ID)
		if err != nil {
			t.Fatal(err)
		}
		want := store.Wait{Code: WaitHeldByMinimums,
			Text:  "no CPU slot: other projects' minReplicas hold all 2 cpuSlots",
			Named: "no CPU slot: the minReplicas of projects a, b hold all 2 cpuSlots",
			Names: []store.ProjectRef{{TeamID: "team", ID: "a"}, {TeamID: "labs", ID: "b"}}}
		if got.State != "queued" || got.WaitingFor == nil || !reflect.DeepEqual(*got.WaitingFor, want) {
			t.Fatalf("call of c: state %s, waitingFor %+v; want queued, %+v", got.State, got.WaitingFor, want)
		}
		if st := h.project("c"); st.HeldBy == nil || !reflect.DeepEqual(*st.HeldBy, want) {
			t.Errorf("status of c: heldBy %+v, want %+v", st.HeldBy, want)
		}
		if st := h.project("a"); st.HeldBy != nil {
			t.Errorf("status of a: heldBy %+v, want none", st.HeldBy)
		}

		b.MinReplicas = 0
		h.st.putProject(b)
		h.s.ProjectChanged(b.ID)
		h.settle()
		if got, _, _ := h.s.Lookup(call.ID); got.WaitingFor == nil || got.WaitingFor.Code == WaitHeldByMinimums {
			t.Errorf("after b's minimum went: waitingFor %+v, want another reason (a boot, a slot freed)", got.WaitingFor)
		}
	})
}
