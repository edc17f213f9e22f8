package scheduler

import (
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"inferd/scheduler/backend"
	"inferd/store"
)

// lookup returns call id as a check sees it.
func (h *harness) lookup(id string) store.Call {
	h.t.Helper()
	h.settle()
	c, _, err := h.s.Lookup(id)
	if err != nil {
		h.t.Fatalf("Lookup(%s): %v", id, err)
	}
	return c
}

// waits checks that call id waits for code, with text, and an ETA of
// wantETA (-1: none).
func (h *harness) waits(id, code, text string, wantETA time.Duration) {
	h.t.Helper()
	c := h.lookup(id)
	if c.WaitingFor == nil {
		h.t.Fatalf("call %s (%s) has no waitingFor; want %s %q", id, c.State, code, text)
	}
	if c.WaitingFor.Code != code || c.WaitingFor.Text != text {
		h.t.Errorf("waitingFor = %s %q; want %s %q", c.WaitingFor.Code, c.WaitingFor.Text, code, text)
	}
	switch {
	case wantETA < 0 && c.ETAMs != nil:
		h.t.Errorf("etaMs = %d; want none", *c.ETAMs)
	case wantETA >= 0 && c.ETAMs == nil:
		h.t.Errorf("no etaMs; want %d", wantETA.Milliseconds())
	case wantETA >= 0 && abs(*c.ETAMs-wantETA.Milliseconds()) > 2:
		h.t.Errorf("etaMs = %d; want %d", *c.ETAMs, wantETA.Milliseconds())
	}
}

func abs(n int64) int64 { return max(n, -n) }

// learn runs n calls of d each on i (ready, idle), so that p's service
// time is measured.
func (h *harness) learn(p store.Project, i *fakeInstance, n int, d time.Duration) {
	h.t.Helper()
	for range n {
		c := h.submit(p, `{}`)
		call := h.call(i)
		h.advance(d)
		call.reply(`{}`)
		if got := h.result(c.ID); got.State != store.CallSucceeded {
			h.t.Fatalf("learning call = %+v", got)
		}
	}
}

func TestWaitingForABootingReplicaSaysHowLongItUsuallyTakes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(0, 1), idleTimeout(5))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		first := h.submit(p, `{}`)
		i := h.launched()
		h.advance(3 * time.Second)
		// Nothing measured yet: the time so far, no estimate.
		h.waits(first.ID, WaitBooting, "replica booting (3.0 s so far)", -1)
		if c := h.lookup(first.ID); c.State != store.CallBooting || c.QueuePosition != 0 {
			t.Errorf("state %s position %d; want booting, 0", c.State, c.QueuePosition)
		}
		h.advance(11 * time.Second) // boots in 14 s
		h.ready(i)
		call := h.call(i)
		h.advance(2 * time.Second)
		call.reply(`{}`)
		h.result(first.ID)
		h.advance(5 * time.Second) // idleTimeout: the replica stops
		if !i.wasStopped() {
			t.Fatal("the idle replica was not stopped")
		}

		again := h.submit(p, `{}`)
		h.launched()
		h.advance(12100 * time.Millisecond)
		// Boot 14 s, 12.1 s gone: ready in 1.9 s, then a 2 s run.
		h.waits(again.ID, WaitBooting, "replica booting (12.1 s of a usual 14 s)", 3900*time.Millisecond)
	})
}

func TestWaitingForBusyReplicasThenMaxReplicas(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(0, 2), idleTimeout(600))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		first := h.submit(p, `{}`)
		r1 := h.launched()
		h.advance(4 * time.Second)
		h.ready(r1)
		c0 := h.call(r1)
		h.advance(2 * time.Second)
		c0.reply(`{}`)
		h.result(first.ID)
		h.learn(p, r1, 2, 2*time.Second) // runs take 2 s

		running := h.submit(p, `{}`)
		c1 := h.call(r1)
		next := h.submit(p, `{}`) // a second replica boots for it
		r2 := h.launched()
		h.advance(time.Second)
		// r1 frees in 1 s, r2 is ready in 3 s: r1 takes it, done in 3 s.
		h.waits(next.ID, WaitReplicasBusy, "its replica busy (next free in ~1.0 s); another booting (1.0 s of a usual 4 s)", 3*time.Second)

		h.ready(r2)
		c2 := h.call(r2)
		last := h.submit(p, `{}`)
		h.advance(500 * time.Millisecond)
		// Both run: r1's call ends in 0.5 s, r2's in 1.5 s; this one starts on r1.
		h.waits(last.ID, WaitMaxReplicas, "maxReplicas 2 reached (all 2 replicas busy, next free in ~0.5 s)", 2500*time.Millisecond)
		behind := h.submit(p, `{}`)
		h.waits(behind.ID, WaitMaxReplicas, "maxReplicas 2 reached (all 2 replicas busy, next free in ~0.5 s)", 3500*time.Millisecond)
		if c := h.lookup(behind.ID); c.QueuePosition != 1 || c.State != store.CallQueued {
			t.Errorf("second in line: position %d state %s", c.QueuePosition, c.State)
		}
		c1.reply(`{}`)
		c2.reply(`{}`)
		h.result(running.ID)
	})
}

// A batching replica with a batch in flight has no room for another call,
// however few calls that batch carries (concurrency counts batches): a call
// behind a batch of one of two waits for it to return, then runs in the
// next pass. It is not "about to run", and its estimate is the batch's
// rest and a pass, not a pass alone.
func TestWaitingBehindABatchThatIsNotFullSaysTheReplicaIsBusy(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("b", minMax(1, 1), batching(2, 50))
		h, i := batchHarness(t, p)
		defer h.stop()
		for range 2 { // passes take 2 s
			c := h.submit(p, `{}`)
			b := h.batchOn(i)
			h.advance(2 * time.Second)
			b.reply(`{}`)
			h.result(c.ID)
		}
		running := h.submit(p, `{"n":0}`)
		b := h.batchOn(i) // alone: a batch of one of two
		h.advance(500 * time.Millisecond)
		next := h.submit(p, `{"n":1}`)
		behind := h.submit(p, `{"n":2}`)
		// The batch ends in 1.5 s; both then go in one pass of 2 s.
		h.waits(next.ID, WaitMaxReplicas, "maxReplicas 1 reached (its replica busy, next free in ~1.5 s)", 3500*time.Millisecond)
		h.waits(behind.ID, WaitMaxReplicas, "maxReplicas 1 reached (its replica busy, next free in ~1.5 s)", 3500*time.Millisecond)
		b.reply(`{}`)
		h.result(running.ID)
		last := h.batchOn(i)
		last.reply(`{}`, `{}`)
		h.result(next.ID)
		h.result(behind.ID)
	})
}

func TestWaitingForTheTeamsRunningCallsQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", team("acme"), minMax(2, 2))
		h := quotaHarness(t, cpuSlots(8), map[string]store.Quota{"acme": {RunningCalls: 1}}, a)
		defer h.stop()
		rs := h.launchedN(2)
		h.ready(rs...)
		h.submit(a, `{}`)
		held := h.submit(a, `{}`)
		h.waits(held.ID, WaitTeamQuota, "team acme quota runningCalls 1/1", -1)
	})
}

func TestWaitingForTheTeamsReplicaQuota(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", team("acme"), minMax(0, 3))
		h := quotaHarness(t, cpuSlots(8), map[string]store.Quota{"acme": {Replicas: 1}}, a)
		defer h.stop()
		h.submit(a, `{}`)
		i := h.launched()
		h.ready(i)
		h.call(i)
		held := h.submit(a, `{}`)
		h.noLaunch()
		h.waits(held.ID, WaitTeamQuota, "its replica busy; team acme quota replicas 1/1", -1)
	})
}

func TestWaitingForCapacityNamesWhatHoldsIt(t *testing.T) {
	t.Run("CPU slots busy with another project's calls, then freed", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := testProject("a", minMax(0, 1))
			b := testProject("b", minMax(0, 1), idleTimeout(600))
			h := newHarness(t, Config{}, cpuSlots(1), a, b)
			defer h.stop()
			bc := h.submit(b, `{}`)
			ib := h.launched()
			h.ready(ib)
			call := h.call(ib)
			ac := h.submit(a, `{}`)
			h.waits(ac.ID, WaitCapacity, "all 1 CPU slots busy with other projects' calls", -1)
			call.reply(`{}`)
			h.result(bc.ID)
			// b's replica is idle now and a waits: it is stopped for a.
			if !ib.wasStopped() {
				t.Fatal("b's idle replica was not evicted")
			}
			h.launched()
			h.waits(ac.ID, WaitBooting, "replica booting (0.0 s so far)", -1)
		})
	})
	t.Run("CPU slot held by another team's minimum, not named", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			m := testProject("m", team("labs"), minMax(1, 1))
			a := testProject("a", minMax(0, 1))
			h := newHarness(t, Config{}, cpuSlots(1), m, a)
			defer h.stop()
			h.ready(h.launched())
			ac := h.submit(a, `{}`)
			h.noLaunch()
			h.waits(ac.ID, WaitHeldByMinimums, "no CPU slot: other projects' minReplicas hold all 1 cpuSlots", -1)
		})
	})
	t.Run("GPU held by an idle replica of another team above its share", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := testProject("a", team("acme"), minMax(0, 2), wholeGPUs(1))
			b := testProject("b", team("labs"), minMax(0, 1), wholeGPUs(1), idleTimeout(20))
			h := newHarness(t, Config{}, simulatedGPUs(2), a, b)
			defer h.stop()
			bc := h.submit(b, `{}`)
			ib := h.launched()
			h.ready(ib)
			h.call(ib).reply(`{}`)
			h.result(bc.ID)
			h.submit(a, `{}`)
			ia := h.launched()
			h.ready(ia)
			h.call(ia) // acme holds one GPU, busy; labs one, idle
			h.advance(5 * time.Second)
			ac := h.submit(a, `{}`)
			h.noLaunch() // acme is at its fair share: labs' idle replica stays until its idleTimeout
			h.waits(ac.ID, WaitHeldByIdle, "its replica busy; GPU held by an idle replica of another project (evictable in 15 s)", -1)
			h.advance(15 * time.Second)
			if !ib.wasStopped() {
				t.Fatal("labs' replica outlived its idleTimeout")
			}
		})
	})
}

func TestWaitingForARestartAfterACrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(0, 1))
		h := newHarness(t, Config{RestartBackoff: 2 * time.Second}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		h.ready(i)
		h.call(i)
		i.exit(errors.New("signal: killed"), "Killed")
		h.result(c.ID)
		next := h.submit(p, `{}`)
		h.advance(500 * time.Millisecond)
		h.waits(next.ID, WaitRestarting, "replica restarting after a crash (next boot in 1.5 s)", -1)
	})
}

func TestWaitingForAFailedBootSaysWhichAttempt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(0, 1))
		h := newHarness(t, Config{MaxBootFailures: 3, RestartBackoff: time.Second}, nil, p)
		defer h.stop()
		c := h.submit(p, `{}`)
		i := h.launched()
		i.exit(errors.New("exit status 1"), "ImportError: no module named torch")
		h.settle()
		got := h.lookup(c.ID)
		if got.WaitingFor == nil || got.WaitingFor.Code != WaitBootFailed || got.WaitingFor.Text != got.Message {
			t.Fatalf("waitingFor = %+v, message %q; want bootFailed with the message's text", got.WaitingFor, got.Message)
		}
	})
}

func TestWaitingForNothingButItsTurn(t *testing.T) {
	// A ready replica with room and a queued call: what a check sees in
	// the moment before the next dispatch (its first write in flight).
	s := New(Config{}, nil, newFakeBackend(1, nil), newFakeClock(), zerolog.Nop())
	p := &project{id: "a", cfg: testProject("a")}
	s.projects["a"], s.order = p, []*project{p}
	r := &rep{p: p, state: stateReady, calls: map[*call]struct{}{}}
	p.replicas = []*rep{r}
	c := &call{p: p}
	why, eta := s.explain(c, 0, s.clk.Now())
	if why == nil || why.Code != WaitNext || eta != nil {
		t.Errorf("explain = %+v, %v; want next, no estimate (nothing measured)", why, eta)
	}
}

func TestFinishOfQueuesCallsOnTheFirstFreeSlot(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name  string
		slots []time.Duration
		svc   time.Duration
		pos   int
		want  time.Duration
	}{
		{"a free slot", []time.Duration{0}, 2 * s, 0, 2 * s},
		{"behind a call ending in 1 s", []time.Duration{s}, 2 * s, 0, 3 * s},
		{"second in line on one slot", []time.Duration{s}, 2 * s, 1, 5 * s},
		{"two slots share the line", []time.Duration{s, 1500 * time.Millisecond}, 2 * s, 1, 3500 * time.Millisecond},
		{"third on two slots", []time.Duration{s, 1500 * time.Millisecond}, 2 * s, 2, 5 * s},
		{"a boot's slots join later", []time.Duration{10 * s, 10 * s, s}, s, 3, 5 * s},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := finishOf(tc.slots, tc.svc, tc.pos); got-tc.want > time.Millisecond || tc.want-got > time.Millisecond {
				t.Errorf("finishOf = %v; want %v", got, tc.want)
			}
		})
	}
}

// A project whose own busy replicas hold every CPU slot waits for them, not
// for other projects' calls; where both hold them, it says how many each.
func TestWaitingForCapacityTellsItsOwnReplicasFromOtherProjects(t *testing.T) {
	t.Run("its own replicas hold every slot", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			p := testProject("a", minMax(0, 3), idleTimeout(600))
			h := newHarness(t, Config{}, cpuSlots(2), p)
			defer h.stop()
			for range 2 {
				h.submit(p, `{}`)
			}
			is := h.launchedN(2)
			h.ready(is...)
			h.call(is[0])
			h.call(is[1])
			c := h.submit(p, `{}`)
			h.waits(c.ID, WaitCapacity, "all 2 replicas busy; no CPU slot for another replica: its own replicas hold all 2 cpuSlots", -1)
		})
	})
	t.Run("its own replica and another project's call", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			a := testProject("a", minMax(0, 3), idleTimeout(600))
			b := testProject("b", minMax(0, 1), idleTimeout(600))
			h := newHarness(t, Config{}, cpuSlots(2), a, b)
			defer h.stop()
			h.submit(a, `{}`)
			ia := h.launched()
			h.ready(ia)
			h.call(ia)
			h.submit(b, `{}`)
			ib := h.launched()
			h.ready(ib)
			h.call(ib)
			c := h.submit(a, `{}`)
			h.waits(c.ID, WaitCapacity, "its replica busy; all 2 CPU slots busy: 1 with its own replicas, 1 with other projects' calls", -1)
		})
	})
}

// An ETA comes with its range: the same estimate from the 10th and the 90th
// percentile of the project's recent runs, around the mean's.
func TestETAComesWithTheRangeOfTheProjectsRecentRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(1, 1), idleTimeout(600))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		i := h.launched()
		h.ready(i)
		for _, d := range []time.Duration{time.Second, time.Second, 2 * time.Second, 5 * time.Second} {
			h.learn(p, i, 1, d) // mean 2.25 s; p10 1 s, p90 5 s
		}
		running := h.submit(p, `{}`)
		call := h.call(i)
		next := h.submit(p, `{}`)
		c := h.lookup(next.ID)
		// The running call ends in 2.25 s (the mean; it has just begun),
		// then this one runs: 1 s, 2.25 s or 5 s.
		if c.ETAMs == nil || c.ETARangeMs == nil || *c.ETAMs != 4500 || *c.ETARangeMs != [2]int64{3250, 7250} {
			t.Fatalf("etaMs %v, etaRangeMs %v; want 4500 within [3250, 7250]", deref(c.ETAMs), c.ETARangeMs)
		}
		if st := h.project("a"); len(st.Queue) != 1 || st.Queue[0].ETARangeMs == nil || *st.Queue[0].ETARangeMs != *c.ETARangeMs {
			t.Errorf("the status's queue = %+v; want the same range", st.Queue)
		}
		call.reply(`{}`)
		h.result(running.ID)
	})
}

func deref(p *int64) any {
	if p == nil {
		return nil
	}
	return *p
}

// TestWaitingForABuildingEnvironmentStopsTheBootClock: while a replica's
// launch builds its Python environment, its calls wait "building
// environment", however long past bootTimeout it takes; the boot, and its
// timeout, count from the build's end.
func TestWaitingForABuildingEnvironmentStopsTheBootClock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(0, 1), func(p *store.Project) { p.Model.BootTimeout = 10 })
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		built := make(chan struct{})
		h.l.mu.Lock()
		h.l.fail = func(spec backend.Spec) error {
			spec.Phase(backend.PhaseBuildingEnvironment)
			<-built
			spec.Phase("")
			return nil
		}
		h.l.mu.Unlock()
		first := h.submit(p, `{}`)
		h.advance(40 * time.Second) // four bootTimeouts
		h.waits(first.ID, WaitBuilding, "building environment (40.0 s so far)", -1)
		close(built)
		i := h.launched()
		h.advance(3 * time.Second)
		h.waits(first.ID, WaitBooting, "replica booting (3.0 s so far)", -1)
		if i.wasStopped() {
			t.Fatal("the replica was stopped for its build's time")
		}
		h.advance(8 * time.Second) // 11 s of boot: past bootTimeout
		if !i.wasStopped() {
			t.Error("the boot timeout, counted from the build's end, did not stop the replica")
		}
	})
}

// TestAReplicaStoppedWhileItBuildsCancelsTheBuild: a project deleted while
// its replica's launch builds its environment closes the launch's Cancel,
// so the build gives up (a build may take up to an hour) instead of
// holding the replica's CPU slot until it ends.
func TestAReplicaStoppedWhileItBuildsCancelsTheBuild(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("a", minMax(0, 1))
		h := newHarness(t, Config{}, nil, p)
		defer h.stop()
		gaveUp := make(chan struct{})
		h.l.mu.Lock()
		h.l.fail = func(spec backend.Spec) error {
			spec.Phase(backend.PhaseBuildingEnvironment)
			<-spec.Cancel
			close(gaveUp)
			spec.Phase("")
			return errors.New("building the python environment failed (the build was cancelled)")
		}
		h.l.mu.Unlock()
		c := h.submit(p, `{}`)
		h.advance(5 * time.Second)
		h.st.deleteProject(p.ID)
		h.s.ProjectChanged(p.ID)
		h.settle()
		select {
		case <-gaveUp:
		default:
			t.Fatal("the build was not told to give up")
		}
		if got := h.result(c.ID); got.State != store.CallFailed {
			t.Errorf("call = %s %q, want failed", got.State, got.Message)
		}
		if st := h.s.Snapshot(); st.CPUSlotsUsed != 0 {
			t.Errorf("%d CPU slots still used", st.CPUSlotsUsed)
		}
	})
}
