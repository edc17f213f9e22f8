package local

import (
	"testing"
	"time"

	"inferd/gpu"
	"inferd/internal/testenv"
)

// fixedEnergy is an inventory whose GPUs' counters go up by step millijoules
// at each read.
type fixedEnergy struct{ mj, step uint64 }

func (f *fixedEnergy) Devices() []gpu.Device { return nil }

func (f *fixedEnergy) EnergyMillijoules(string) (uint64, bool) {
	f.mj += f.step
	return f.mj, true
}

func TestMeasureCountsTheReplicasCPUAndMemory(t *testing.T) {
	needRoot(t)
	b := testBackend(t)
	if b.sb.cgroups == nil || b.sb.cgroups.v2 == "" {
		testenv.Missing(t, "a cgroup v2 per replica: %s", b.sb.cgWhy)
	}
	p := startReady(t, b, echoSpec(t, "meter-1"))
	end := p.Measure()
	infer(t, p, `{"burn": 0.3}`)
	u := end()
	if !u.CPUKnown || u.CPU < 250*time.Millisecond || u.CPU > 2*time.Second {
		t.Errorf("CPU = %v (known %v); want about the 0.3 s the call burned", u.CPU, u.CPUKnown)
	}
	if u.EnergyJoules != nil {
		t.Errorf("energy = %v for a CPU replica; want absent", *u.EnergyJoules)
	}
	idle := p.Measure()
	if u := idle(); !u.CPUKnown || u.CPU > 100*time.Millisecond {
		t.Errorf("an idle stretch measured %v of CPU", u.CPU)
	}
	// A call's window may begin at a reading under a millisecond old, never
	// at an older one: the CPU burned since by a call nobody measured is
	// not the next call's.
	infer(t, p, `{"burn": 0.3}`)
	next := p.Measure()
	infer(t, p, `{}`)
	if u := next(); !u.CPUKnown || u.CPU > 100*time.Millisecond {
		t.Errorf("a no-op call measured %v of CPU, after 0.3 s burned since the last reading", u.CPU)
	}
	if b.sb.cgroups.v2Ctl["memory"] || b.sb.cgroups.v1["memory"].base != "" {
		if u.PeakMemoryBytes < 1<<20 {
			t.Errorf("peak memory %d bytes; a python model uses megabytes", u.PeakMemoryBytes)
		}
	}
}

func TestMeasureReadsTheReplicasGPUEnergy(t *testing.T) {
	p := &Process{b: &Backend{cfg: Config{GPUs: &fixedEnergy{step: 1500}}}}
	p.spec.GPUs = []string{"GPU-0", "GPU-1"}
	u := p.Measure()()
	// Two GPUs read at the start (1500, 3000) and at the end (4500, 6000).
	if u.EnergyJoules == nil || *u.EnergyJoules != 6 {
		t.Errorf("energy = %v; want 6 J", u.EnergyJoules)
	}
	if u.CPUKnown || u.PeakMemoryBytes != 0 {
		t.Errorf("a replica without a cgroup measured CPU %v, peak %d", u.CPUKnown, u.PeakMemoryBytes)
	}
	p.spec.GPUs = nil
	if u := p.Measure()(); u.EnergyJoules != nil {
		t.Errorf("a CPU replica's energy = %v; want absent", *u.EnergyJoules)
	}
}

// The replica's meter keeps its cgroup files open and reads them afresh
// each call; where the kernel resets memory.peak per descriptor, each call
// in flight has one of its own, reused, reset, by the next call, so a call's
// peak is its own and not that of an earlier, larger call.
func TestMeasuredPeakIsReadAfreshEachCall(t *testing.T) {
	needRoot(t)
	b := testBackend(t)
	cgs := b.sb.cgroups
	if cgs == nil || !cgs.v2Ctl["memory"] && cgs.v1["memory"].base == "" {
		testenv.Missing(t, "a memory cgroup per replica: %s", b.sb.cgWhy)
	}
	p := startReady(t, b, echoSpec(t, "meter-peak"))
	measured := func(inputs string) int64 {
		end := p.Measure()
		infer(t, p, inputs)
		return end().PeakMemoryBytes
	}
	small := measured(`{}`)
	big := measured(`{"holdMiB": 96}`)
	if big < 96<<20 || big < small+64<<20 {
		t.Fatalf("peaks %d then %d bytes; want the second call's 96 MiB on top", small, big)
	}
	meter := &p.box.cg.meter
	if !cgs.v2Ctl["memory"] || meter.noReset {
		return // the peak since the replica started: nothing more to see
	}
	if after := measured(`{}`); after > big-64<<20 {
		t.Errorf("a small call after the 96 MiB one measured %d bytes; want its own peak", after)
	}
	if n := len(meter.idlePeaks); n != 1 {
		t.Fatalf("%d idle memory.peak descriptors after calls one after the other; want the one reused", n)
	}
	a, c := p.Measure(), p.Measure() // two calls in flight: two descriptors
	a()
	c()
	if n := len(meter.idlePeaks); n != 2 {
		t.Errorf("%d idle descriptors after two overlapping calls; want 2", n)
	}
}
