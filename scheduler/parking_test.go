package scheduler

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"inferd/gpu"
	"inferd/scheduler/backend"
	"inferd/store"
)

// Parking's state machine (parking.go) on a fake checkpointer whose Park and
// Restore wait for the test to answer them, under the fake clock.

// parkOp is one Park or Restore waiting for the test's answer.
type parkOp struct {
	inst backend.Instance
	ctx  context.Context
	done chan error
}

// answer ends the operation with err (nil: it worked).
func (op *parkOp) answer(err error) { op.done <- err }

// parkingBackend is the fake backend with a fake Checkpointer.
type parkingBackend struct {
	*fakeBackend
	parks, restores chan *parkOp
}

func (b *parkingBackend) ParkSupport() error { return nil }

func (b *parkingBackend) Park(ctx context.Context, inst backend.Instance) (backend.ParkReport, error) {
	err := b.wait(ctx, inst, b.parks)
	return backend.ParkReport{CUDAProcesses: 1}, err
}

func (b *parkingBackend) Restore(ctx context.Context, inst backend.Instance) error {
	return b.wait(ctx, inst, b.restores)
}

// wait hands an operation to the test and waits for its answer or ctx.
func (b *parkingBackend) wait(ctx context.Context, inst backend.Instance, ops chan<- *parkOp) error {
	op := &parkOp{inst: inst, ctx: ctx, done: make(chan error, 1)}
	ops <- op
	select {
	case err := <-op.done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// parkObs records what parking tells its observer.
type parkObs struct {
	nopObserver
	mu                 sync.Mutex
	parked, restored   []time.Duration
	parkFails          int
	restoreFails       []string
	crashes, evictions int
}

func (o *parkObs) ReplicaParked(_ string, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.parked = append(o.parked, took)
}

func (o *parkObs) ReplicaRestored(_ string, took time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.restored = append(o.restored, took)
}

func (o *parkObs) ParkFailed(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.parkFails++
}

func (o *parkObs) RestoreFailed(_, reason string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.restoreFails = append(o.restoreFails, reason)
}

func (o *parkObs) ReplicaCrashed(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.crashes++
}

func (o *parkObs) ReplicaEvicted(string) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.evictions++
}

// parkHarness is a harness whose backend parks, with its observer.
type parkHarness struct {
	*harness
	pb  *parkingBackend
	obs *parkObs
}

func newParkHarness(t *testing.T, gpus Inventory, projects ...store.Project) *parkHarness {
	t.Helper()
	ph := &parkHarness{obs: &parkObs{}}
	ph.harness = startHarnessOn(t, Config{Observer: ph.obs, GPUPoll: time.Second}, gpus, newTestStore(t, projects...),
		func(l *fakeBackend) backend.Backend {
			ph.pb = &parkingBackend{fakeBackend: l, parks: make(chan *parkOp, 100), restores: make(chan *parkOp, 100)}
			return ph.pb
		})
	return ph
}

// nextOp returns the operation waiting on ops, failing if there is none.
func (h *parkHarness) nextOp(ops chan *parkOp, what string) *parkOp {
	h.t.Helper()
	h.settle()
	select {
	case op := <-ops:
		return op
	default:
		h.t.Fatalf("no %s was asked for", what)
		return nil
	}
}

func (h *parkHarness) park() *parkOp    { h.t.Helper(); return h.nextOp(h.pb.parks, "Park") }
func (h *parkHarness) restore() *parkOp { h.t.Helper(); return h.nextOp(h.pb.restores, "Restore") }

// noOp checks that no Park or Restore is waiting.
func (h *parkHarness) noOp() {
	h.t.Helper()
	h.settle()
	select {
	case op := <-h.pb.parks:
		h.t.Fatalf("unexpected Park of %s", op.inst.(*fakeInstance).spec.ReplicaID)
	case op := <-h.pb.restores:
		h.t.Fatalf("unexpected Restore of %s", op.inst.(*fakeInstance).spec.ReplicaID)
	default:
	}
}

// warm boots a replica of p for one call and serves it: the replica is
// ready and idle when it returns.
func (h *parkHarness) warm(p store.Project) *fakeInstance {
	h.t.Helper()
	c := h.submit(p, `{}`)
	i := h.launched()
	h.serveOne(i)
	if got := h.result(c.ID); got.State != store.CallSucceeded {
		h.t.Fatalf("call on %s = %s %q", i.spec.ReplicaID, got.State, got.Message)
	}
	return i
}

// parked boots a replica of p for one call, serves it, lets parkTimeout
// pass and parks it: the replica is parked when it returns.
func (h *parkHarness) parked(p store.Project) *fakeInstance {
	h.t.Helper()
	i := h.warm(p)
	h.advance(seconds(p.Model.ParkTimeout))
	op := h.park()
	if op.inst != i {
		h.t.Fatalf("parked %v, want %s", op.inst, i.spec.ReplicaID)
	}
	op.answer(nil)
	h.settle()
	if got := h.replicaStates(p.ID); !slices.Equal(got, []string{i.spec.ReplicaID + ":parked"}) {
		h.t.Fatalf("after Park: %v", got)
	}
	return i
}

func parkTimeout(s int) func(*store.Project) {
	return func(p *store.Project) { p.Model.ParkTimeout = s }
}

// parking is project "a": at most one replica, on a whole GPU, parked after
// 10 s idle and stopped after 600 s; opts change that.
func parking(opts ...func(*store.Project)) store.Project {
	return testProject("a", append([]func(*store.Project){minMax(0, 1), idleTimeout(600), wholeGPUs(1), parkTimeout(10)}, opts...)...)
}

// gpuHolders returns the replicas holding GPU uuid, as the status says.
func (h *parkHarness) gpuHolders(uuid string) []string {
	h.t.Helper()
	h.settle()
	for _, g := range h.s.Snapshot().GPUs {
		if g.UUID == uuid {
			return g.Replicas
		}
	}
	h.t.Fatalf("no GPU %s in the status", uuid)
	return nil
}

func TestIdleGPUReplicaParksAfterParkTimeoutAndItsGPUGoesToAnotherProject(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		b := testProject("b", minMax(0, 1), idleTimeout(600), wholeGPUs(1))
		h := newParkHarness(t, simulatedGPUs(1), a, b)
		defer h.stop()
		ia := h.warm(a)

		h.advance(9 * time.Second)
		h.noOp() // idle 9 s of 10
		h.advance(time.Second)
		op := h.park()
		if got := h.replicaStates("a"); !slices.Equal(got, []string{"a-1:parking"}) {
			t.Errorf("while Park runs: %v", got)
		}
		cb := h.submit(b, `{}`)
		h.noLaunch() // a parking replica still holds its GPU, and is not evicted
		h.clk.Advance(1500 * time.Millisecond)
		op.answer(nil)
		h.settle()

		if got := h.replicaStates("a"); !slices.Equal(got, []string{"a-1:parked"}) {
			t.Errorf("after Park: %v", got)
		}
		if ia.wasStopped() {
			t.Error("the parked replica was stopped")
		}
		if ps := h.project("a").Replicas[0]; !ps.ParkedSince.Equal(h.clk.Now()) {
			t.Errorf("parkedSince %v, want %v", ps.ParkedSince, h.clk.Now())
		}
		ib := h.launched()
		h.servesOn(ib, cb.ID, "GPU-0")
		if got := h.gpuHolders("GPU-0"); !slices.Equal(got, []string{"b-1"}) {
			t.Errorf("GPU-0 held by %v, want only b-1 (a-1 is parked)", got)
		}
		if !slices.Equal(h.obs.parked, []time.Duration{1500 * time.Millisecond}) {
			t.Errorf("observed parks %v, want one of 1.5s", h.obs.parked)
		}
	})
}

func TestCallToAParkedProjectRestoresItsReplicaAndRunsOnIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		h := newParkHarness(t, simulatedGPUs(1), a)
		defer h.stop()
		ia := h.parked(a)

		c := h.submit(a, `{"x":1}`)
		op := h.restore()
		if op.inst != ia {
			t.Fatalf("restoring %v, want a-1", op.inst)
		}
		h.waits(c.ID, WaitBooting, "replica restoring from parking", -1)
		if got := h.replicaStates("a"); !slices.Equal(got, []string{"a-1:restoring"}) {
			t.Errorf("while Restore runs: %v", got)
		}
		if got := h.gpuHolders("GPU-0"); !slices.Equal(got, []string{"a-1"}) {
			t.Errorf("GPU-0 held by %v while restoring, want a-1", got)
		}
		h.noCall(ia) // not before it is restored
		h.clk.Advance(2 * time.Second)
		op.answer(nil)
		h.settle()

		fc := h.call(ia)
		if string(fc.inputs) != `{"x":1}` {
			t.Errorf("the restored replica got %s", fc.inputs)
		}
		fc.reply(`{}`)
		got := h.result(c.ID)
		if got.State != store.CallSucceeded || got.BootMs != 2000 {
			t.Errorf("call = %s bootMs %d, want succeeded after a 2000 ms restore", got.State, got.BootMs)
		}
		h.noLaunch()
		if !slices.Equal(h.obs.restored, []time.Duration{2 * time.Second}) {
			t.Errorf("observed restores %v", h.obs.restored)
		}

		// Idle again: it parks again after parkTimeout.
		h.advance(10 * time.Second)
		h.park().answer(nil)
		h.settle()
		if got := h.replicaStates("a"); !slices.Equal(got, []string{"a-1:parked"}) {
			t.Errorf("after the second Park: %v", got)
		}
	})
}

func TestParkedReplicaWhoseGPUWasTakenIsStoppedAndTheCallBootsElsewhere(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		b := testProject("b", minMax(0, 1), idleTimeout(600), wholeGPUs(1))
		h := newParkHarness(t, simulatedGPUs(2), a, b)
		defer h.stop()
		// b-1 takes GPU-0, then a-1 GPU-1; b-1 goes, so that a-1 parks alone.
		cb := h.submit(b, `{}`)
		h.servesOn(h.launched(), cb.ID, "GPU-0")
		ia := h.parked(a)
		if !slices.Equal(ia.spec.GPUs, []string{"GPU-1"}) {
			t.Fatalf("a-1 on %v", ia.spec.GPUs)
		}
		// Two more b calls at once: its second replica goes on the GPU a-1
		// handed back.
		b2 := testProject("b", minMax(0, 2), idleTimeout(600), wholeGPUs(1))
		h.st.putProject(b2)
		h.s.ProjectChanged("b")
		h.settle()
		c1, c2 := h.submit(b2, `{}`), h.submit(b2, `{}`)
		ib2 := h.launched()
		if !slices.Equal(ib2.spec.GPUs, []string{"GPU-1"}) {
			t.Fatalf("b-2 on %v, want GPU-1, which a-1 handed back", ib2.spec.GPUs)
		}
		h.serveOne(ib2)

		ca := h.submit(a, `{}`)
		h.noOp() // no Restore: its GPU is b-2's
		if !ia.wasStopped() {
			t.Fatal("the parked replica whose GPU is taken was not stopped")
		}
		if !slices.Equal(h.obs.restoreFails, []string{RestoreGPUTaken}) {
			t.Errorf("restore failures %v", h.obs.restoreFails)
		}
		// The cold boot waits for a GPU, evicts an idle b replica, and runs.
		ia2 := h.launched()
		if ia2.spec.ReplicaID != "a-2" {
			t.Fatalf("launched %s, want a-2", ia2.spec.ReplicaID)
		}
		h.serveOne(ia2)
		if got := h.result(ca.ID); got.State != store.CallSucceeded {
			t.Errorf("a's call = %s %q", got.State, got.Message)
		}
		for _, id := range []string{c1.ID, c2.ID} {
			if got := h.state(id); got != store.CallSucceeded && got != store.CallRunning && got != store.CallQueued {
				t.Errorf("b's call %s = %s", id, got)
			}
		}
	})
}

func TestRestoreFailureOrTimeoutStopsTheReplicaAndTheCallGetsAColdBoot(t *testing.T) {
	for _, tc := range []struct {
		name   string
		end    func(h *parkHarness, op *parkOp)
		reason string
	}{
		{"restore fails", func(h *parkHarness, op *parkOp) { op.answer(errors.New("CUDA_ERROR_OUT_OF_MEMORY")) }, RestoreError},
		{"restore outlasts bootTimeout", func(h *parkHarness, op *parkOp) {
			h.advance(599 * time.Second)
			if op.ctx.Err() != nil {
				h.t.Fatal("Restore cancelled before bootTimeout")
			}
			h.advance(time.Second)
			if op.ctx.Err() == nil {
				h.t.Error("Restore not cancelled at bootTimeout")
			}
		}, RestoreTimedOut},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := parking()
				h := newParkHarness(t, simulatedGPUs(1), a)
				defer h.stop()
				ia := h.parked(a)
				c := h.submit(a, `{}`)
				tc.end(h, h.restore())
				h.settle()
				if !ia.wasStopped() {
					t.Fatal("the replica that could not be restored was not stopped")
				}
				h.noCall(ia)
				h.succeedOnNewReplica(c.ID)
				if !slices.Equal(h.obs.restoreFails, []string{tc.reason}) {
					t.Errorf("restore failures %v, want %s", h.obs.restoreFails, tc.reason)
				}
				if h.obs.crashes != 0 {
					t.Errorf("%d crashes counted for a replica stopped on purpose", h.obs.crashes)
				}
			})
		})
	}
}

func TestParkingUnsupportedKeepsTheReplicaWarmAndTheProjectStopsTrying(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		h := newParkHarness(t, simulatedGPUs(1), a)
		defer h.stop()
		ia := h.warm(a)
		h.advance(10 * time.Second)
		h.park().answer(errors.Join(backend.ErrParkUnsupported, errors.New("the NVIDIA driver has no checkpoint API (570 or later needed)")))
		h.settle()

		if got := h.replicaStates("a"); !slices.Equal(got, []string{"a-1:ready"}) {
			t.Errorf("after an unsupported Park: %v", got)
		}
		if ia.wasStopped() {
			t.Error("the replica was stopped though Park did nothing")
		}
		if got := h.project("a").ParkingOff; got == "" {
			t.Error("the status does not say parking is off")
		}
		h.advance(100 * time.Second)
		h.noOp() // it does not try again
		c2 := h.submit(a, `{}`)
		h.serveOne(ia) // straight to the warm replica
		if got := h.result(c2.ID); got.State != store.CallSucceeded {
			t.Errorf("call = %s", got.State)
		}
		if h.obs.parkFails != 0 {
			t.Errorf("an unsupported Park counted as %d failures", h.obs.parkFails)
		}
	})
}

func TestFailedParkStopsTheReplicaAndParkingUntilTheSpecChanges(t *testing.T) {
	for _, tc := range []struct {
		name string
		end  func(h *parkHarness, op *parkOp)
	}{
		{"Park fails", func(h *parkHarness, op *parkOp) { op.answer(errors.New("cuCheckpointProcessLock: CUDA_ERROR_TIMEOUT")) }},
		{"Park outlasts bootTimeout", func(h *parkHarness, op *parkOp) {
			h.advance(600 * time.Second)
			if op.ctx.Err() == nil {
				h.t.Error("Park not cancelled at bootTimeout")
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := parking(idleTimeout(6000))
				h := newParkHarness(t, simulatedGPUs(1), a)
				defer h.stop()
				ia := h.warm(a)
				h.advance(10 * time.Second)
				tc.end(h, h.park())
				h.settle()
				if !ia.wasStopped() {
					t.Fatal("a replica whose Park failed was not stopped")
				}
				if h.obs.parkFails != 1 {
					t.Errorf("park failures %d, want 1", h.obs.parkFails)
				}
				if h.project("a").ParkingOff == "" {
					t.Error("the status does not say parking is off")
				}
				// The next call boots cold; that replica never parks.
				c2 := h.submit(a, `{}`)
				ia2 := h.launched()
				h.serveOne(ia2)
				h.result(c2.ID)
				h.advance(100 * time.Second)
				h.noOp()

				// A new spec parks again.
				a.Model.Env = map[string]string{"NEW": "1"}
				h.st.putProject(a)
				h.s.ProjectChanged("a")
				h.settle()
				c3 := h.submit(a, `{}`)
				ia3 := h.launched()
				h.serveOne(ia3)
				h.result(c3.ID)
				if h.project("a").ParkingOff != "" {
					t.Error("parking still off after a spec change")
				}
				h.advance(10 * time.Second)
				if op := h.park(); op.inst != ia3 {
					t.Errorf("parking %v, want a-3", op.inst)
				}
			})
		})
	}
}

func TestACallDuringParkingWaitsForItThenRestores(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		h := newParkHarness(t, simulatedGPUs(1), a)
		defer h.stop()
		ia := h.warm(a)
		h.advance(10 * time.Second)
		op := h.park()

		c2 := h.submit(a, `{}`)
		h.noLaunch() // its replica is parking, not gone
		h.noCall(ia)
		op.answer(nil)
		h.restore().answer(nil)
		h.serveOne(ia)
		if got := h.result(c2.ID); got.State != store.CallSucceeded {
			t.Errorf("call = %s", got.State)
		}
	})
}

func TestParkedReplicaStopsAtIdleTimeoutOnlyAboveTheMinimum(t *testing.T) {
	for _, tc := range []struct {
		name  string
		min   int
		stops bool
	}{
		{"above the minimum", 0, true},
		{"the minimum", 1, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := parking(minMax(tc.min, 1), idleTimeout(60))
				h := newParkHarness(t, simulatedGPUs(1), a)
				defer h.stop()
				var ia *fakeInstance
				if tc.min > 0 {
					ia = h.launched()
					h.ready(ia)
					h.advance(10 * time.Second)
					h.park().answer(nil)
				} else {
					ia = h.parked(a)
				}
				h.advance(49 * time.Second)
				if ia.wasStopped() {
					t.Fatal("stopped before idleTimeout")
				}
				h.advance(time.Second)
				if ia.wasStopped() != tc.stops {
					t.Errorf("stopped at idleTimeout = %v, want %v", ia.wasStopped(), tc.stops)
				}
				h.advance(time.Hour)
				if want := tc.min; len(h.project("a").Replicas) != want {
					t.Errorf("replicas %v, want %d", h.replicaStates("a"), want)
				}
				if h.obs.crashes != 0 {
					t.Errorf("%d crashes counted", h.obs.crashes)
				}
			})
		})
	}
}

func TestOnlyIdleGPUReplicasOfParkingProjectsPark(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cpu := testProject("cpu", minMax(0, 1), idleTimeout(600), parkTimeout(10)) // gpus 0: nothing to free
		off := testProject("off", minMax(0, 1), idleTimeout(600), wholeGPUs(1))    // parkTimeout 0
		busy := testProject("busy", minMax(0, 1), idleTimeout(600), wholeGPUs(1), parkTimeout(10))
		h := newParkHarness(t, simulatedGPUs(2), cpu, off, busy)
		defer h.stop()
		for _, p := range []store.Project{cpu, off} {
			c := h.submit(p, `{}`)
			h.serveOne(h.launched())
			h.result(c.ID)
		}
		h.submit(busy, `{}`)
		ib := h.launched()
		h.ready(ib)
		fc := h.call(ib) // busy for the whole parkTimeout
		h.advance(30 * time.Second)
		h.noOp()
		fc.reply(`{}`)
		h.settle()
		h.advance(9 * time.Second)
		h.noOp() // its idle time counts from its last call
		h.advance(time.Second)
		if op := h.park(); op.inst != ib {
			t.Errorf("parking %v, want busy-1", op.inst)
		}
	})
}

func TestProjectChangeOrDeleteStopsAParkedReplica(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(h *parkHarness, p store.Project)
	}{
		{"spec changed", func(h *parkHarness, p store.Project) {
			p.Model.Env = map[string]string{"V": "2"}
			h.st.putProject(p)
			h.s.ProjectChanged(p.ID)
		}},
		{"deleted", func(h *parkHarness, p store.Project) {
			h.st.deleteProject(p.ID)
			h.s.ProjectChanged(p.ID)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				a := parking()
				h := newParkHarness(t, simulatedGPUs(1), a)
				defer h.stop()
				ia := h.parked(a)
				tc.change(h, a)
				h.settle()
				if !ia.wasStopped() {
					t.Fatal("the parked replica was not stopped")
				}
				h.noOp()
			})
		})
	}
}

func TestShutdownEndsAParkInFlight(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		h := newParkHarness(t, simulatedGPUs(1), a)
		ia := h.warm(a)
		h.advance(10 * time.Second)
		op := h.park() // never answered: the shutdown must end it
		h.stop()
		if op.ctx.Err() == nil {
			t.Error("the Park in flight was not cancelled")
		}
		if !ia.wasStopped() {
			t.Error("the parking replica was not stopped")
		}
	})
}

func TestParkedReplicaThatDiesIsACrash(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		h := newParkHarness(t, simulatedGPUs(1), a)
		defer h.stop()
		ia := h.parked(a)
		ia.exit(errors.New("signal: killed"), "")
		h.settle()
		if h.obs.crashes != 1 {
			t.Errorf("crashes %d, want 1", h.obs.crashes)
		}
		if got := h.project("a").LastError; got == "" {
			t.Error("no lastError for a parked replica that died")
		}
		if got := h.gpuHolders("GPU-0"); len(got) != 0 {
			t.Errorf("GPU-0 held by %v", got)
		}
	})
}

// On a real GPU a parked replica's memory shows free only at the next
// driver read: until then its GPU is still its own (nobody else is placed
// there, and it restores there), then the driver's reading decides.
func TestOnARealGPUTheParkedReplicasMemoryIsFreeOnlyOnceTheDriverShowsIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		b := testProject("b", minMax(0, 1), idleTimeout(600), gpuMemory(8000))
		gpus := newLiveGPUs(1)
		h := newParkHarness(t, gpus, a, b)
		defer h.stop()
		ia := h.warm(a)
		gpus.change(0, func(d *gpu.Device) {
			d.MemoryFreeMiB = 1000
			d.Processes = []gpu.Process{{Pid: ia.pid, UsedMiB: 15000}}
		})
		h.advance(10 * time.Second)
		refreshes := gpus.refreshCalls()
		h.park().answer(nil)
		h.settle()
		if gpus.refreshCalls() != refreshes+1 {
			t.Error("no driver read was asked for once parked")
		}
		cb := h.submit(b, `{}`)
		h.noLaunch() // the driver has not shown a's memory back yet
		gpus.change(0, func(d *gpu.Device) { d.MemoryFreeMiB, d.Processes = 16000, nil })
		h.advance(time.Second) // the GPU poll reads it
		ib := h.launched()
		h.servesOn(ib, cb.ID, "GPU-0")
		gpus.change(0, func(d *gpu.Device) {
			d.MemoryFreeMiB = 8000
			d.Processes = []gpu.Process{{Pid: ib.pid, UsedMiB: 8000}}
		})

		// a's whole GPU now has b on it: a's call boots a fresh replica,
		// which waits for b to be evicted.
		ca := h.submit(a, `{}`)
		if !ia.wasStopped() || !slices.Equal(h.obs.restoreFails, []string{RestoreGPUTaken}) {
			t.Fatalf("stopped %v, restore failures %v", ia.wasStopped(), h.obs.restoreFails)
		}
		if !ib.wasStopped() {
			t.Fatal("b's idle replica was not evicted for a's cold boot")
		}
		gpus.change(0, func(d *gpu.Device) { d.MemoryFreeMiB, d.Processes = 16000, nil })
		h.advance(time.Second)
		h.succeedOnNewReplica(ca.ID)
	})
}

// A call that comes before the driver has been read since the park finds
// the GPU still the parked replica's (its memory still reads as used):
// it restores there.
func TestOnARealGPUACallBeforeTheNextDriverReadRestoresTheParkedReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		gpus := newLiveGPUs(1)
		h := newParkHarness(t, gpus, a)
		defer h.stop()
		ia := h.warm(a)
		gpus.change(0, func(d *gpu.Device) {
			d.MemoryFreeMiB = 1000
			d.Processes = []gpu.Process{{Pid: ia.pid, UsedMiB: 15000}}
		})
		h.advance(10 * time.Second)
		h.park().answer(nil)
		h.settle()

		c2 := h.submit(a, `{}`)
		h.restore().answer(nil)
		h.serveOne(ia)
		if got := h.result(c2.ID); got.State != store.CallSucceeded || ia.wasStopped() {
			t.Errorf("call = %s, replica stopped %v", got.State, ia.wasStopped())
		}
	})
}

// A warm-up (POST /v1/projects/:id/warmup) of a parked project restores it
// and answers once it is ready.
func TestWarmupRestoresAParkedReplica(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		h := newParkHarness(t, simulatedGPUs(1), a)
		defer h.stop()
		ia := h.parked(a)
		done := make(chan error, 1)
		go func() { done <- h.s.Warmup(context.Background(), a) }()
		op := h.restore()
		select {
		case err := <-done:
			t.Fatalf("Warmup returned %v before the restore", err)
		default:
		}
		op.answer(nil)
		h.settle()
		if err := <-done; err != nil {
			t.Errorf("Warmup = %v", err)
		}
		if got := h.replicaStates("a"); !slices.Equal(got, []string{"a-1:ready"}) || ia.wasStopped() {
			t.Errorf("after the warm-up: %v", got)
		}
	})
}

// A parked replica's time is still its project's (idle), but not its GPU's:
// the usage ledger charges no GPU-seconds while it is parked.
func TestParkedTimeIsChargedWithoutGPUSeconds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking(minMax(1, 1)) // a minimum: it parks and stays
		h := newParkHarness(t, simulatedGPUs(1), a)
		defer h.stop()
		i := h.launched()
		h.ready(i)                  // booted at once
		h.advance(10 * time.Second) // 10 s idle, on its GPU
		h.park().answer(nil)
		h.advance(40 * time.Second) // 40 s parked, to 00:00:50
		c := h.submit(a, `{}`)
		h.restore().answer(nil)
		h.serveOne(i)
		h.result(c.ID)
		h.advance(10 * time.Second) // past the minute's flush
		rows := h.rows()
		if len(rows) != 1 {
			t.Fatalf("rows = %+v; want one", rows)
		}
		if r := rows[0]; !near(r.IdleReplicaSeconds, 60) || !near(r.IdleGPUSeconds, 20) {
			t.Errorf("row = %+v; want 60 idle replica-seconds, of which only the 20 unparked on the GPU", r)
		}
	})
}

// A sync start to a parked project waits through the restore and is
// answered with its result once that result's one write commits: the
// restore's wait is the start's, not a reason to write the call earlier.
func TestSyncStartToAParkedProjectIsAnsweredWithItsResultAfterTheRestore(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := parking()
		h := newParkHarness(t, simulatedGPUs(1), a)
		defer h.stop()
		ia := h.parked(a)

		res := h.submitWait(context.Background(), a, time.Minute)
		op := h.restore()
		h.noAnswer(res, "while the replica was restoring")
		h.clk.Advance(2 * time.Second)
		op.answer(nil)
		h.settle()
		h.st.setHold(func(c store.Call) bool { return c.State.Done() })
		h.call(ia).reply(`{"y":1}`)
		h.noAnswer(res, "while its result's write was held back")
		h.st.release()
		r := <-res
		if r.err != nil || r.c.State != store.CallSucceeded || string(r.c.Outputs) != `{"y":1}` || r.c.BootMs != 2000 {
			t.Fatalf("SubmitWait = %+v, %v; want its result after a 2000 ms restore", r.c, r.err)
		}
		if got := h.st.states(r.c.ID); !slices.Equal(got, []store.CallState{store.CallSucceeded}) {
			t.Errorf("writes = %v, want only the final one", got)
		}
	})
}
