package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"inferd/gpu"
	"inferd/scheduler/backend"
	"inferd/store"
)

func wholeGPUs(n int) func(*store.Project) {
	return func(p *store.Project) { p.Model.GPUs = n }
}

func gpuMemory(mib int) func(*store.Project) {
	return func(p *store.Project) { p.Model.GPUMemoryMiB = mib }
}

// serveOne makes i ready if it is not, and answers the one call sent to it.
func (h *harness) serveOne(i *fakeInstance) {
	h.t.Helper()
	if !isClosed(i.ready) {
		h.ready(i)
	}
	h.call(i).reply(`{}`)
	h.settle()
}

// servesOn checks that i was pinned to gpus, then has it serve the call
// waiting for it and checks that call id succeeded.
func (h *harness) servesOn(i *fakeInstance, id string, gpus ...string) {
	h.t.Helper()
	if !slices.Equal(i.spec.GPUs, gpus) {
		h.t.Errorf("%s on %v, want %v", i.spec.ReplicaID, i.spec.GPUs, gpus)
	}
	h.serveOne(i)
	if got := h.result(id); got.State != store.CallSucceeded {
		h.t.Errorf("call on %s = %s %q", i.spec.ReplicaID, got.State, got.Message)
	}
}

func TestGPUEvictionStopsLeastRecentlyUsedIdleReplicaThenTheWaitingCallRuns(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", minMax(0, 2), idleTimeout(600), wholeGPUs(1))
		b := testProject("b", minMax(0, 1), wholeGPUs(1))
		h := newHarness(t, Config{}, simulatedGPUs(2), a, b)
		defer h.stop()
		h.submit(a, `{}`)
		h.submit(a, `{}`)
		as := h.launchedN(2)
		h.ready(as...)
		fa := []*fakeCall{h.call(as[0]), h.call(as[1])}
		h.clk.Advance(time.Second)
		fa[1].reply(`{}`) // a-2 idle first: least recently used
		h.settle()
		h.clk.Advance(time.Second)
		fa[0].reply(`{}`)
		h.settle()

		c := h.submit(b, `{}`)
		if !as[1].wasStopped() || as[0].wasStopped() {
			t.Fatalf("stopped a-1 %v, a-2 %v; want only a-2 (least recently used)", as[0].wasStopped(), as[1].wasStopped())
		}
		ib := h.launched()
		if ib.spec.ProjectID != "b" || !slices.Equal(ib.spec.GPUs, as[1].spec.GPUs) {
			t.Fatalf("launched %s on %v, want b on a-2's GPU %v", ib.spec.ReplicaID, ib.spec.GPUs, as[1].spec.GPUs)
		}
		h.serveOne(ib)
		if got := h.result(c.ID); got.State != store.CallSucceeded {
			t.Errorf("b's call = %s %q", got.State, got.Message)
		}
	})
}

func TestGPUCallsWaitWhileEveryReplicaIsBusyOrAMinimum(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		keep := testProject("keep", minMax(1, 1), wholeGPUs(1)) // its minimum: never evicted
		busy := testProject("busy", minMax(0, 1), wholeGPUs(1))
		b := testProject("b", minMax(0, 1), wholeGPUs(1))
		h := newHarness(t, Config{}, simulatedGPUs(2), keep, busy, b)
		defer h.stop()
		ik := h.launched()
		h.ready(ik)
		h.submit(busy, `{}`)
		ib := h.launched()
		h.ready(ib)
		fc := h.call(ib)

		c := h.submit(b, `{}`)
		h.noLaunch()
		if ik.wasStopped() || ib.wasStopped() {
			t.Fatal("a minimum or busy replica was evicted")
		}
		if ps := h.project("b"); ps.Waiting != "waiting for GPU" || ps.Queued != 1 {
			t.Errorf("b: waiting %q, queued %d", ps.Waiting, ps.Queued)
		}
		if got := h.state(c.ID); got != store.CallQueued {
			t.Errorf("b's call is %s, want queued", got)
		}

		fc.reply(`{}`) // busy goes idle: now it may be evicted for b
		h.settle()
		if !ib.wasStopped() {
			t.Fatal("the idle replica was not evicted for the waiting call")
		}
		h.serveOne(h.launched())
		if got := h.result(c.ID); got.State != store.CallSucceeded {
			t.Errorf("b's call = %s %q", got.State, got.Message)
		}
		if ps := h.project("b"); ps.Waiting != "" {
			t.Errorf("b still waiting: %q", ps.Waiting)
		}
	})
}

func TestGPUEvictionStopsNothingWhenStoppingAllItMay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		keep := testProject("keep", minMax(1, 1), wholeGPUs(1))
		spare := testProject("spare", minMax(0, 1), idleTimeout(600), wholeGPUs(1))
		big := testProject("big", minMax(0, 1), wholeGPUs(2))
		h := newHarness(t, Config{}, simulatedGPUs(2), keep, spare, big)
		defer h.stop()
		h.ready(h.launched())
		h.submit(spare, `{}`)
		is := h.launched()
		h.serveOne(is)

		h.submit(big, `{}`)
		h.noLaunch()
		if is.wasStopped() {
			t.Error("evicted spare although big needs keep's GPU too")
		}
		if got := h.project("big").Waiting; got != "waiting for GPU" {
			t.Errorf("big waiting = %q", got)
		}
	})
}

func TestGPUSharesPackByMemoryAndEvictOnlyWhatIsNeeded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		// One 16 GiB GPU: a and small share it, then big needs a's memory.
		a := testProject("a", minMax(0, 1), idleTimeout(600), gpuMemory(10000))
		small := testProject("small", minMax(0, 1), idleTimeout(600), gpuMemory(4000))
		big := testProject("big", minMax(0, 1), gpuMemory(12000))
		h := newHarness(t, Config{}, simulatedGPUs(1), a, small, big)
		defer h.stop()
		h.submit(a, `{}`)
		ia := h.launched()
		h.serveOne(ia)
		h.clk.Advance(time.Second)
		h.submit(small, `{}`)
		is := h.launched()
		if !slices.Equal(is.spec.GPUs, []string{"GPU-0"}) || ia.wasStopped() {
			t.Fatalf("small on %v, a stopped %v; want small beside a on GPU-0", is.spec.GPUs, ia.wasStopped())
		}
		h.serveOne(is) // small is idle now too, but more recently used than a

		c := h.submit(big, `{}`)
		if !ia.wasStopped() {
			t.Fatal("a (10000 MiB, least recently used) was not evicted")
		}
		if is.wasStopped() {
			t.Error("small was evicted too: 16384-4000 leaves room for 12000")
		}
		h.servesOn(h.launched(), c.ID, "GPU-0")
	})
}

// A project's minimum replicas that share GPUs go to different GPUs while
// there are GPUs for them: one GPU's failure takes one, not all.
func TestGPUSharesOfOneProjectSpreadOverTheGPUs(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", minMax(2, 2), gpuMemory(4000))
		h := newHarness(t, Config{}, simulatedGPUs(2), a)
		defer h.stop()
		var on []string
		for _, i := range h.launchedN(2) {
			on = append(on, i.spec.GPUs...)
		}
		slices.Sort(on)
		if !slices.Equal(on, []string{"GPU-0", "GPU-1"}) {
			t.Errorf("a's two replicas are on %v; want one on each GPU", on)
		}
	})
}

func TestSubmitRejectsShareLargerThanAnyGPU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("huge", gpuMemory(20000))
		h := newHarness(t, Config{}, simulatedGPUs(2), p)
		defer h.stop()
		_, err := h.s.Submit(t.Context(), p, nil)
		if want := "project needs 1 GPUs with 20000 MiB, this machine has 0 that large"; err == nil || err.Error() != want {
			t.Fatalf("Submit error = %v, want %q", err, want)
		}
		h.noLaunch()
	})
}

// liveGPUs is an Inventory of real (not simulated) GPUs whose driver
// readings the test controls.
type liveGPUs struct {
	mu       sync.Mutex
	devs     []gpu.Device
	refreshs int // RefreshSoon calls
}

func (g *liveGPUs) RefreshSoon() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.refreshs++
}

func (g *liveGPUs) refreshCalls() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.refreshs
}

// change is one refresh that changes device k as the test says.
func (g *liveGPUs) change(k int, f func(d *gpu.Device)) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.devs[k].Samples++
	f(&g.devs[k])
}

func newLiveGPUs(n int) *liveGPUs {
	g := &liveGPUs{}
	for i := range n {
		g.devs = append(g.devs, gpu.Device{Index: i, UUID: fmt.Sprintf("GPU-%d", i), MemoryTotalMiB: 16384, MemoryFreeMiB: 16384, Samples: 1})
	}
	return g
}

func (g *liveGPUs) Devices() []gpu.Device {
	g.mu.Lock()
	defer g.mu.Unlock()
	out := slices.Clone(g.devs)
	for k := range out {
		out[k].Processes = slices.Clone(out[k].Processes)
	}
	return out
}

// read is one refresh: every device read again with free memory free[i].
func (g *liveGPUs) read(free ...uint64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i := range g.devs {
		g.devs[i].Samples++
		g.devs[i].MemoryFreeMiB = free[i]
	}
}

func TestRealGPUComesBackOnlyOnceTheDriverIsReadAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", minMax(0, 1), idleTimeout(600), wholeGPUs(1))
		b := testProject("b", minMax(0, 1), wholeGPUs(1))
		gpus := newLiveGPUs(1)
		h := newHarness(t, Config{GPUPoll: time.Second}, gpus, a, b)
		defer h.stop()
		h.submit(a, `{}`)
		ia := h.launched()
		h.serveOne(ia)
		gpus.read(1000) // a's model holds most of the GPU

		c := h.submit(b, `{}`)
		if !ia.wasStopped() || !ia.hasExited() {
			t.Fatal("a was not evicted")
		}
		h.noLaunch() // exited, but the driver has not been read since
		if got := h.project("b").Waiting; got != "waiting for GPU" {
			t.Errorf("b waiting = %q", got)
		}
		h.advance(time.Second)
		h.noLaunch() // the poll found no new reading

		gpus.read(16000)
		h.advance(time.Second)
		ib := h.launched()
		h.serveOne(ib)
		if got := h.result(c.ID); got.State != store.CallSucceeded {
			t.Errorf("b's call = %s %q", got.State, got.Message)
		}
	})
}

func TestGPUShareWaitsForTheDriversFreeMemory(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		b := testProject("b", minMax(0, 1), gpuMemory(8000))
		gpus := newLiveGPUs(1)
		gpus.read(1000) // used outside inferd
		h := newHarness(t, Config{GPUPoll: time.Second}, gpus, b)
		defer h.stop()
		c := h.submit(b, `{}`)
		h.noLaunch()
		if got := h.project("b").Waiting; got != "waiting for GPU" {
			t.Errorf("b waiting = %q", got)
		}
		gpus.read(4000)
		h.advance(time.Second)
		h.noLaunch()

		gpus.read(9000)
		h.advance(time.Second)
		h.serveOne(h.launched())
		if got := h.result(c.ID); got.State != store.CallSucceeded {
			t.Errorf("b's call = %s %q", got.State, got.Message)
		}
	})
}

func TestSnapshotReportsWhatInferdHandedOutOnEachGPU(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		whole := testProject("whole", minMax(1, 1), wholeGPUs(1))
		a := testProject("a", minMax(0, 1), idleTimeout(60), gpuMemory(4000))
		b := testProject("b", minMax(0, 1), idleTimeout(600), gpuMemory(6000))
		h := newHarness(t, Config{}, simulatedGPUs(3), whole, a, b)
		defer h.stop()
		h.ready(h.launched())
		h.submit(a, `{}`)
		h.serveOne(h.launched())
		h.submit(b, `{}`)
		h.serveOne(h.launched())

		want := []GPUStatus{
			{UUID: "GPU-0", ReservedMiB: 16384, Replicas: []string{"whole-1"}},
			{UUID: "GPU-1", ReservedMiB: 10000, Replicas: []string{"a-1", "b-1"}},
			{UUID: "GPU-2", ReservedMiB: 0, Replicas: []string{}},
		}
		if got := h.s.Snapshot().GPUs; !equalGPUStatus(got, want) {
			t.Fatalf("GPUs = %+v, want %+v", got, want)
		}

		h.advance(time.Minute) // a's idle timeout: its share comes back at once on a simulated GPU
		if got := h.replicaStates("a"); len(got) != 0 {
			t.Fatalf("a's replicas = %v, want none after the idle timeout", got)
		}
		want[1] = GPUStatus{UUID: "GPU-1", ReservedMiB: 6000, Replicas: []string{"b-1"}}
		if got := h.s.Snapshot().GPUs; !equalGPUStatus(got, want) {
			t.Errorf("after a stopped: GPUs = %+v, want %+v", got, want)
		}
	})
}

func TestSnapshotKeepsAnExitedReplicasRealGPUUntilTheDriverIsReadAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", minMax(0, 1), idleTimeout(60), wholeGPUs(1))
		gpus := newLiveGPUs(1)
		h := newHarness(t, Config{GPUPoll: time.Second}, gpus, a)
		defer h.stop()
		h.submit(a, `{}`)
		ia := h.launched()
		h.serveOne(ia)
		h.advance(time.Minute)
		if !ia.hasExited() {
			t.Fatal("a did not stop at its idle timeout")
		}
		held := []GPUStatus{{UUID: "GPU-0", ReservedMiB: 16384, Replicas: []string{"a-1"}}}
		if got := h.s.Snapshot().GPUs; !equalGPUStatus(got, held) {
			t.Fatalf("before the driver is read again: GPUs = %+v, want %+v", got, held)
		}
		gpus.read(16384)
		h.advance(time.Second)
		free := []GPUStatus{{UUID: "GPU-0", Replicas: []string{}}}
		if got := h.s.Snapshot().GPUs; !equalGPUStatus(got, free) {
			t.Errorf("after the driver showed it free: GPUs = %+v, want %+v", got, free)
		}
	})
}

func equalGPUStatus(a, b []GPUStatus) bool {
	return slices.EqualFunc(a, b, func(x, y GPUStatus) bool {
		return x.UUID == y.UUID && x.ReservedMiB == y.ReservedMiB && x.Replicas != nil && slices.Equal(x.Replicas, y.Replicas)
	})
}

// TestGPUShareCountsWhatEachReplicaUsesAndHasYetToAllocate is the
// overcommit case through the scheduler: a share is placed only where it
// still fits once every replica has allocated what it declared, going by
// the memory the driver lists each replica's process as using.
func TestGPUShareCountsWhatEachReplicaUsesAndHasYetToAllocate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const h100 = 81559
		a := testProject("a", minMax(0, 1), idleTimeout(600), gpuMemory(20480))
		b := testProject("b", minMax(0, 1), idleTimeout(600), gpuMemory(30720))
		c := testProject("c", minMax(0, 1), gpuMemory(25600))
		gpus := newLiveGPUs(1)
		gpus.change(0, func(d *gpu.Device) { d.MemoryTotalMiB, d.MemoryFreeMiB = h100, h100 })
		h := newHarness(t, Config{GPUPoll: time.Second}, gpus, a, b, c)
		defer h.stop()
		h.submit(a, `{}`)
		ia := h.launched()
		h.serveOne(ia)
		h.submit(b, `{}`)
		ib := h.launched()
		h.serveOne(ib)

		// a uses twice what it declared; b has not allocated yet.
		gpus.change(0, func(d *gpu.Device) {
			d.MemoryFreeMiB = h100 - 40960
			d.Processes = []gpu.Process{{Pid: ia.pid, UsedMiB: 40960}}
		})
		h.advance(time.Second)
		call := h.submit(c, `{}`)
		h.noLaunch()
		if got := h.project("c").Waiting; got != "waiting for GPU" {
			t.Errorf("c waiting = %q, want waiting for GPU", got)
		}

		// a gives back what it did not declare: now c fits beside b's share.
		gpus.change(0, func(d *gpu.Device) {
			d.MemoryFreeMiB = h100 - 20480
			d.Processes = []gpu.Process{{Pid: ia.pid, UsedMiB: 20480}}
		})
		h.advance(time.Second)
		h.servesOn(h.launched(), call.ID, "GPU-0")
	})
}

// TestWholeGPUWaitsWhileAProcessOutsideInferdUsesIt: a GPU filled by a
// foreign process is not handed out whole; the replica goes elsewhere or
// waits until the process is gone.
func TestWholeGPUWaitsWhileAProcessOutsideInferdUsesIt(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("p", minMax(0, 2), idleTimeout(600), wholeGPUs(1))
		gpus := newLiveGPUs(2)
		gpus.change(0, func(d *gpu.Device) {
			d.MemoryFreeMiB = 4000
			d.Processes = []gpu.Process{{Pid: 4242, UsedMiB: 12000}}
		})
		h := newHarness(t, Config{GPUPoll: time.Second}, gpus, p)
		defer h.stop()
		h.submit(p, `{}`)
		h.submit(p, `{}`)
		first := h.launched()
		if !slices.Equal(first.spec.GPUs, []string{"GPU-1"}) {
			t.Fatalf("first replica on %v, want GPU-1 (GPU-0 is in use outside inferd)", first.spec.GPUs)
		}
		h.noLaunch()
		if got := h.project("p").Waiting; got != "waiting for GPU" {
			t.Errorf("p waiting = %q, want waiting for GPU", got)
		}
		gpus.change(0, func(d *gpu.Device) { d.MemoryFreeMiB, d.Processes = 16384, nil })
		h.advance(time.Second)
		if second := h.launched(); !slices.Equal(second.spec.GPUs, []string{"GPU-0"}) {
			t.Errorf("second replica on %v, want GPU-0 once the foreign process is gone", second.spec.GPUs)
		}
	})
}

// TestLostGPUGetsNoReplicasUntilItIsHealthyAgain: a lost GPU is kept out
// of placement, a project that needs it fails its calls at once saying so,
// and once the inventory finds it healthy again it is used.
func TestLostGPUGetsNoReplicasUntilItIsHealthyAgain(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		one := testProject("one", minMax(0, 2), idleTimeout(600), wholeGPUs(1))
		two := testProject("two", minMax(0, 1), wholeGPUs(2))
		gpus := newLiveGPUs(2)
		gpus.change(0, func(d *gpu.Device) { d.Problem = "lost (ERROR_GPU_IS_LOST)" })
		h := newHarness(t, Config{GPUPoll: time.Second}, gpus, one, two)
		defer h.stop()

		_, err := h.s.Submit(t.Context(), two, []byte(`{}`))
		if !errors.Is(err, ErrNeedsGPUs) || !strings.Contains(err.Error(), "this machine has 1 (and 1 unhealthy") {
			t.Errorf("Submit(two) = %v, want ErrNeedsGPUs naming the unhealthy GPU", err)
		}
		h.submit(one, `{}`)
		h.submit(one, `{}`)
		if i := h.launched(); !slices.Equal(i.spec.GPUs, []string{"GPU-1"}) {
			t.Fatalf("replica on %v, want GPU-1, not the lost GPU-0", i.spec.GPUs)
		}
		h.noLaunch()

		gpus.change(0, func(d *gpu.Device) { d.Problem = "" }) // rediscovered
		h.advance(time.Second)
		if i := h.launched(); !slices.Equal(i.spec.GPUs, []string{"GPU-0"}) {
			t.Errorf("replica on %v, want GPU-0 once healthy again", i.spec.GPUs)
		}
	})
}

// TestMIGDevicesArePinnedAsTheirOwnUnits: each MIG device is a placement
// unit pinned by its MIG-<uuid>; a replica that needs two GPUs cannot be
// made of MIG devices.
func TestMIGDevicesArePinnedAsTheirOwnUnits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := testProject("p", minMax(0, 3), idleTimeout(600), wholeGPUs(1))
		pair := testProject("pair", minMax(0, 1), wholeGPUs(2))
		gpus := newLiveGPUs(3)
		for k, uuid := range []string{"MIG-a", "MIG-b"} {
			gpus.change(k+1, func(d *gpu.Device) {
				d.Index, d.UUID, d.MIG, d.Parent, d.MemoryTotalMiB, d.MemoryFreeMiB = 1, uuid, true, "GPU-1", 9856, 9856
			})
		}
		h := newHarness(t, Config{}, gpus, p, pair)
		defer h.stop()
		for range 3 {
			h.submit(p, `{}`)
		}
		var got []string
		for _, i := range h.launchedN(3) {
			got = append(got, strings.Join(i.spec.GPUs, ","))
		}
		if want := []string{"GPU-0", "MIG-a", "MIG-b"}; !slices.Equal(got, want) {
			t.Errorf("replicas pinned to %v, want %v", got, want)
		}
		if _, err := h.s.Submit(t.Context(), pair, []byte(`{}`)); !errors.Is(err, ErrNeedsGPUs) {
			t.Errorf("Submit(pair) = %v, want ErrNeedsGPUs: two MIG devices are not two GPUs", err)
		}
	})
}

// TestReplicaExitAsksTheInventoryForAFreshRead: the driver is read again as
// soon as a replica on a real GPU has exited, not at the next interval.
func TestReplicaExitAsksTheInventoryForAFreshRead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := testProject("a", minMax(0, 1), idleTimeout(60), wholeGPUs(1))
		gpus := newLiveGPUs(1)
		h := newHarness(t, Config{}, gpus, a)
		defer h.stop()
		h.submit(a, `{}`)
		ia := h.launched()
		h.serveOne(ia)
		if n := gpus.refreshCalls(); n != 0 {
			t.Fatalf("RefreshSoon called %d times while the replica runs", n)
		}
		h.advance(time.Minute) // idle timeout: it stops and exits
		if !ia.hasExited() {
			t.Fatal("a did not stop at its idle timeout")
		}
		if n := gpus.refreshCalls(); n != 1 {
			t.Errorf("RefreshSoon called %d times after the exit, want 1", n)
		}
	})
}

// groupBackend tells process groups as the local-process backend does.
type groupBackend struct {
	backend.Backend
	groups map[int]int
}

func (l groupBackend) ProcessGroup(pid int) (int, bool) {
	g, ok := l.groups[pid]
	return g, ok
}

func TestAttributeCountsAReplicasForkedProcessesAsItsOwn(t *testing.T) {
	s := &Scheduler{backend: groupBackend{groups: map[int]int{1000: 1000, 1001: 1000, 1002: 1000, 2000: 2000, 3000: 1}}}
	devices := []gpu.Device{
		{UUID: "A", Processes: []gpu.Process{{Pid: 1000}, {Pid: 1001}, {Pid: 2000}, {Pid: 3000}}},
		{UUID: "B", Processes: []gpu.Process{{Pid: 1002}, {Pid: 4000}}}, // 4000: gone since the read
	}
	held := []assignment{{replica: "r", group: 1000}, {replica: "q", group: 2000}, {replica: "booting", group: 0}, {replica: "x", group: 4000}}
	s.attribute(held, devices)
	want := map[string][]int{"r": {1000, 1001, 1002}, "q": {2000}, "booting": nil, "x": {4000}}
	for _, a := range held {
		got := slices.Sorted(slices.Values(a.pids))
		if !slices.Equal(got, want[a.replica]) {
			t.Errorf("%s owns %v, want %v", a.replica, got, want[a.replica])
		}
	}
}

// FitsNow answers by the rule a scale-up follows: a CPU project fits while a
// slot is free; a GPU project where placement would hand it GPUs now,
// whole ones held by no replica, or shares beside another's.
func TestFitsNowIsTheFitRuleOfAScaleUp(t *testing.T) {
	shares := func(n, mib int) func(*store.Project) {
		return func(p *store.Project) { p.Model.GPUs, p.Model.GPUMemoryMiB = n, mib }
	}
	synctest.Test(t, func(t *testing.T) {
		whole := testProject("whole", minMax(1, 1), wholeGPUs(1))     // one GPU whole
		share := testProject("share", minMax(1, 1), gpuMemory(10000)) // 10000 of another's 16384 MiB
		h := startHarness(t, Config{}, simulatedGPUs(3), newTestStore(t, whole, share))
		defer h.stop()
		h.ready(h.launchedN(2)...)
		for _, tc := range []struct {
			name string
			m    func(*store.Project)
			want bool
		}{
			{"a whole GPU, one left", wholeGPUs(1), true},
			{"two whole GPUs, one left", wholeGPUs(2), false},
			{"two shares, one beside the other share", shares(2, 6000), true},
			{"two shares, too large beside the other share", shares(2, 8000), false},
			{"a CPU project, slots free", func(*store.Project) {}, true},
		} {
			if got := h.s.FitsNow(testProject("asked", tc.m).Model); got != tc.want {
				t.Errorf("%s: FitsNow = %v, want %v", tc.name, got, tc.want)
			}
		}
	})
	synctest.Test(t, func(t *testing.T) {
		cpu := testProject("cpu", minMax(1, 1))
		h := startHarness(t, Config{}, cpuSlots(1), newTestStore(t, cpu))
		defer h.stop()
		h.ready(h.launched())
		if h.s.FitsNow(testProject("asked").Model) {
			t.Error("a CPU project fits with every slot taken")
		}
	})
}
