package scheduler

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"inferd/store"
)

// Sync starts are written only when they end, so while they wait and run
// LiveCalls is where a status reader finds them: each team's own, newest
// first, within the limit, queued, booting or running on their replica.
// Once a call's final write has committed it is left out, even before the
// loop has heard of the commit: the store lists it from then on.
func TestLiveCallsListSyncStartsInFlightByTeamNewestFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("sync", minMax(1, 1))
		rival := testProject("rival", minMax(0, 1), func(p *store.Project) { p.TeamID = "rival" })
		h := newHarness(t, Config{}, nil, p, rival)
		defer h.stop()
		i := h.launched()
		h.ready(i)

		running := h.submitWait(context.Background(), p, time.Minute)
		fc := h.call(i)
		queued := h.submitWait(context.Background(), p, time.Minute)
		h.settle()
		booting := h.submitWait(context.Background(), rival, time.Minute)
		ri := h.launched() // rival's replica, booting

		own := h.s.LiveCalls("team", 10)
		if len(own) != 2 {
			t.Fatalf("LiveCalls(team) = %+v, want the queued and the running call", own)
		}
		q, r := own[0], own[1]
		if q.ID <= r.ID || q.State != store.CallQueued || q.ProjectID != "sync" || q.TeamID != "team" || q.Created.IsZero() ||
			q.ReplicaID != "" || !q.Dispatched.IsZero() {
			t.Errorf("newest = %+v, want the queued call", q)
		}
		if r.State != store.CallRunning || r.ReplicaID != i.spec.ReplicaID || r.Dispatched.IsZero() || r.Attempt != 1 {
			t.Errorf("oldest = %+v, want the call running on %s", r, i.spec.ReplicaID)
		}
		for _, c := range own {
			if got := h.st.states(c.ID); len(got) != 0 {
				t.Errorf("call %s was written %v: a sync start in flight is written at its end only", c.ID, got)
			}
		}
		if got := h.s.LiveCalls("team", 1); len(got) != 1 || got[0].ID != q.ID {
			t.Errorf("LiveCalls(team, 1) = %+v, want the newest call only", got)
		}
		all := h.s.LiveCalls("", 10)
		if len(all) != 3 || all[0].TeamID != "rival" || all[0].State != store.CallBooting || all[0].ProjectID != "rival" {
			t.Errorf("LiveCalls(every team) = %+v, want rival's booting call first, then team's two", all)
		}
		if got := h.s.LiveCalls("rival", 10); len(got) != 1 || got[0].ID != all[0].ID {
			t.Errorf("LiveCalls(rival) = %+v, want its one call only", got)
		}

		// The running call's result: its write held, then committed while
		// the loop is busy, so that only the commit itself has been seen.
		h.st.setHold(func(c store.Call) bool { return c.ID == r.ID && c.State.Done() })
		fc.reply(`{"y":2}`)
		h.settle()
		if got := h.s.LiveCalls("team", 10); len(got) != 2 || got[1].ID != r.ID || got[1].State != store.CallRunning {
			t.Errorf("while its final write is in flight, LiveCalls = %+v, want it still running", got)
		}
		var res waitResult
		var listed []LiveCall
		h.s.control(func() {
			h.st.release()
			res = <-running
			listed = h.s.liveCalls("team", 10)
		})
		if res.err != nil || res.c.ID != r.ID || res.c.State != store.CallSucceeded {
			t.Fatalf("the running call's start = %+v, %v", res.c, res.err)
		}
		if len(listed) != 1 || listed[0].ID != q.ID {
			t.Errorf("once its final write committed, LiveCalls = %+v, want only the other call", listed)
		}

		// The queued call runs next; the others end too.
		h.call(i).reply(`{}`)
		h.ready(ri)
		h.call(ri).reply(`{}`)
		for _, res := range []<-chan waitResult{queued, booting} {
			if r := <-res; r.err != nil || r.c.State != store.CallSucceeded {
				t.Errorf("start = %+v, %v", r.c, r.err)
			}
		}
		if got := h.s.LiveCalls("", 10); len(got) != 0 {
			t.Errorf("with every call ended, LiveCalls = %+v", got)
		}
	})
}
