package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"inferd/gpu"
	"inferd/store"
)

// dev is a GPU with total MiB, all of it free unless free is given.
func dev(index int, uuid string, total uint64, free ...uint64) gpu.Device {
	d := gpu.Device{Index: index, UUID: uuid, MemoryTotalMiB: total, MemoryFreeMiB: total}
	if len(free) > 0 {
		d.MemoryFreeMiB = free[0]
	}
	return d
}

func hold(replica string, memMiB uint64, gpus ...string) assignment {
	return assignment{replica: replica, gpus: gpus, memoryMiB: memMiB}
}

func TestPlace(t *testing.T) {
	four := []gpu.Device{dev(2, "C", 16384), dev(0, "A", 16384), dev(3, "D", 16384), dev(1, "B", 16384)}
	two := []gpu.Device{dev(0, "A", 16384), dev(1, "B", 16384)}
	for _, tc := range []placeCase{
		{"cpu replica needs nothing", nil, nil, placementRequest{}, nil, true},
		{"no GPUs", nil, nil, placementRequest{gpus: 1}, nil, false},

		// Whole GPUs.
		{"whole: lowest index first", four, nil, placementRequest{gpus: 1}, []string{"A"}, true},
		{"whole: skips held GPUs", four, []assignment{hold("p-1", 0, "A", "C")}, placementRequest{gpus: 2}, []string{"B", "D"}, true},
		{"whole: multi-GPU replica", four, nil, placementRequest{gpus: 3}, []string{"A", "B", "C"}, true},
		{"whole: not enough free", four, []assignment{hold("p-1", 0, "A", "B", "C")}, placementRequest{gpus: 2}, nil, false},
		{"whole: a GPU shared by memory is not whole", two, []assignment{hold("s-1", 1024, "A")}, placementRequest{gpus: 1}, []string{"B"}, true},
		{"whole: every GPU partly shared", two, []assignment{hold("s-1", 1024, "A"), hold("s-2", 1024, "B")}, placementRequest{gpus: 1}, nil, false},

		// Shares by memory.
		{"share: fits beside another share", two[:1], []assignment{hold("s-1", 10000, "A")}, placementRequest{gpus: 1, memoryMiB: 6000}, []string{"A"}, true},
		{"share: does not fit beside it", two[:1], []assignment{hold("s-1", 10000, "A")}, placementRequest{gpus: 1, memoryMiB: 7000}, nil, false},
		{"share: never on a whole-held GPU", two, []assignment{hold("w-1", 0, "A")}, placementRequest{gpus: 1, memoryMiB: 1}, []string{"B"}, true},
		{"share: best fit keeps a GPU whole", two, []assignment{hold("s-1", 8000, "B")}, placementRequest{gpus: 1, memoryMiB: 4000}, []string{"B"}, true},
		{"share: spreads a project's replicas over the GPUs", two, []assignment{{replica: "s-1", project: "s", gpus: []string{"B"}, memoryMiB: 8000}},
			placementRequest{gpus: 1, memoryMiB: 4000, project: "s"}, []string{"A"}, true},
		{"share: doubles up where the project has the fewest", two, []assignment{{replica: "s-1", project: "s", gpus: []string{"A"}, memoryMiB: 8000},
			{replica: "s-2", project: "s", gpus: []string{"B"}, memoryMiB: 4000}, {replica: "s-3", project: "s", gpus: []string{"B"}, memoryMiB: 1000}},
			placementRequest{gpus: 1, memoryMiB: 4000, project: "s"}, []string{"A"}, true},
		{"share: best fit by the driver's free memory", []gpu.Device{dev(0, "A", 16384), dev(1, "B", 16384, 5000)}, nil, placementRequest{gpus: 1, memoryMiB: 4000}, []string{"B"}, true},
		{"share: ties go to the lowest index", []gpu.Device{dev(1, "B", 16384), dev(0, "A", 16384)}, nil, placementRequest{gpus: 1, memoryMiB: 4000}, []string{"A"}, true},
		{
			"share: fragmentation: free memory adds up but no GPU has enough",
			two, []assignment{hold("s-1", 10000, "A"), hold("s-2", 10000, "B")},
			placementRequest{gpus: 1, memoryMiB: 8000}, nil, false,
		},
		{
			"share: the driver's free memory limits it (used outside inferd, or not shown back yet)",
			[]gpu.Device{dev(0, "A", 16384, 3000)}, nil, placementRequest{gpus: 1, memoryMiB: 4000}, nil, false,
		},
		{
			"share: inferd's bookkeeping limits it (handed out, not allocated yet)",
			[]gpu.Device{dev(0, "A", 16384)}, []assignment{hold("s-1", 14000, "A")}, placementRequest{gpus: 1, memoryMiB: 4000}, nil, false,
		},
		{
			"share: over-committed bookkeeping reads as no free memory",
			[]gpu.Device{dev(0, "A", 1000)}, []assignment{hold("s-1", 800, "A"), hold("s-2", 800, "A")}, placementRequest{gpus: 1, memoryMiB: 1}, nil, false,
		},
		{
			"share: multi-GPU replica takes distinct GPUs",
			four, []assignment{hold("s-1", 12000, "A")}, placementRequest{gpus: 2, memoryMiB: 8000}, []string{"B", "C"}, true,
		},
		{
			"share: multi-GPU replica needs that many GPUs with room",
			two, []assignment{hold("s-1", 12000, "A")}, placementRequest{gpus: 2, memoryMiB: 8000}, nil, false,
		},
	} {
		t.Run(tc.name, tc.run)
	}
}

// placeCase is one row of a placement table.
type placeCase struct {
	name    string
	devices []gpu.Device
	held    []assignment
	req     placementRequest
	want    []string
	ok      bool
}

func (tc placeCase) run(t *testing.T) {
	held := slices.Clone(tc.held)
	got, ok := place(tc.devices, tc.held, tc.req)
	if ok != tc.ok || !slices.Equal(got, tc.want) {
		t.Errorf("place = %v, %v; want %v, %v", got, ok, tc.want, tc.ok)
	}
	if !slices.EqualFunc(held, tc.held, func(a, b assignment) bool { return a.replica == b.replica }) {
		t.Error("place changed its input")
	}
}

// procs returns d with the driver listing procs on it.
func procs(d gpu.Device, ps ...gpu.Process) gpu.Device {
	d.Processes = ps
	return d
}

// owning returns a with the driver's pids that belong to its replica.
func owning(a assignment, pids ...int) assignment {
	a.pids = pids
	return a
}

// TestPlaceByWhatGPUsHold covers the rules that read the driver: per-process
// usage against what replicas reserved, whole GPUs under foreign load,
// unhealthy devices and MIG devices.
func TestPlaceByWhatGPUsHold(t *testing.T) {
	const h100 = 81559 // MiB
	// The overcommit case: A declared 20 GiB and uses 40 GiB, B declared
	// 30 GiB and has not allocated yet. NVML free is about 41 GiB and total
	// minus reserved about 31 GiB, yet only about 10 GiB will be left once B
	// loads: a 25 GiB share must wait.
	aUses40 := procs(dev(0, "H", h100, h100-40960), gpu.Process{Pid: 101, UsedMiB: 40960})
	overcommit := []assignment{owning(hold("a-1", 20480, "H"), 101), owning(hold("b-1", 30720, "H"), 202)}
	bLoaded := procs(dev(0, "H", h100, h100-40960-30720), gpu.Process{Pid: 101, UsedMiB: 40960}, gpu.Process{Pid: 202, UsedMiB: 30720})
	asDeclared := procs(dev(0, "H", h100, h100-20480-30720), gpu.Process{Pid: 101, UsedMiB: 20480}, gpu.Process{Pid: 202, UsedMiB: 30720})

	lost := dev(0, "A", 16384)
	lost.Problem = "lost (ERROR_GPU_IS_LOST)"
	mig := func(idx int, uuid string, total uint64) gpu.Device {
		d := dev(idx, uuid, total)
		d.MIG, d.Parent = true, fmt.Sprintf("GPU-parent-%d", idx)
		return d
	}
	v2 := dev(0, "A", 16384, 16384-600) // GetMemoryInfo_v2: 600 MiB reserved by the driver
	v2.DriverReservedMiB = 600

	for _, tc := range []placeCase{
		// Shares by what replicas use.
		{"share: the overcommit example is refused", []gpu.Device{aUses40}, overcommit, placementRequest{gpus: 1, memoryMiB: 25600}, nil, false},
		{"share: what is left after B loads fits", []gpu.Device{aUses40}, overcommit, placementRequest{gpus: 1, memoryMiB: 9000}, []string{"H"}, true},
		{"share: once B has loaded the same holds", []gpu.Device{bLoaded}, overcommit, placementRequest{gpus: 1, memoryMiB: 25600}, nil, false},
		{"share: replicas using what they declared leave the rest", []gpu.Device{asDeclared}, overcommit, placementRequest{gpus: 1, memoryMiB: 25600}, []string{"H"}, true},
		{
			"share: a replica's forked processes count as its own",
			[]gpu.Device{procs(dev(0, "A", 16384, 16384-8000), gpu.Process{Pid: 11, UsedMiB: 4000}, gpu.Process{Pid: 12, UsedMiB: 4000})},
			[]assignment{owning(hold("s-1", 8000, "A"), 11, 12)},
			placementRequest{gpus: 1, memoryMiB: 8000}, []string{"A"}, true,
		},
		{
			"share: an exited replica still listed by a stale read is not counted twice",
			[]gpu.Device{procs(dev(0, "A", 16384, 16384-8000), gpu.Process{Pid: 11, UsedMiB: 8000})},
			[]assignment{owning(hold("gone-1", 8000, "A"), 11)},
			placementRequest{gpus: 1, memoryMiB: 8000}, []string{"A"}, true,
		},
		{"share: driver-reserved memory is not usable", []gpu.Device{v2}, []assignment{hold("s-1", 8000, "A")}, placementRequest{gpus: 1, memoryMiB: 8000}, nil, false},

		// Whole GPUs and what else runs there.
		{
			"whole: a GPU a foreign process fills is not whole",
			[]gpu.Device{procs(dev(0, "A", 16384, 4000), gpu.Process{Pid: 4242, UsedMiB: 12000}), dev(1, "B", 16384)},
			nil, placementRequest{gpus: 1}, []string{"B"}, true,
		},
		{
			"whole: any foreign compute process keeps it from being whole",
			[]gpu.Device{procs(dev(0, "A", 16384), gpu.Process{Pid: 4242, UsedMiB: 300})},
			nil, placementRequest{gpus: 1}, nil, false,
		},
		{
			"whole: memory used by processes the driver does not list",
			[]gpu.Device{dev(0, "A", 16384, 9000), dev(1, "B", 16384)},
			nil, placementRequest{gpus: 1}, []string{"B"}, true,
		},
		{"whole: the driver's own few hundred MiB do not count", []gpu.Device{dev(0, "A", 16384, 16384-450)}, nil, placementRequest{gpus: 1}, []string{"A"}, true},
		{"whole: v2 splits reserved memory out", []gpu.Device{v2}, nil, placementRequest{gpus: 1}, []string{"A"}, true},

		// Health.
		{"unhealthy: a lost GPU gets no whole replica", []gpu.Device{lost, dev(1, "B", 16384)}, nil, placementRequest{gpus: 2}, nil, false},
		{"unhealthy: nor a share", []gpu.Device{lost, dev(1, "B", 16384, 1000)}, nil, placementRequest{gpus: 1, memoryMiB: 4000}, nil, false},
		{"unhealthy: the healthy one is used", []gpu.Device{lost, dev(1, "B", 16384)}, nil, placementRequest{gpus: 1}, []string{"B"}, true},

		// MIG devices.
		{
			"MIG: each MIG device is a unit, in NVML's order",
			[]gpu.Device{mig(0, "MIG-x", 9856), mig(0, "MIG-y", 9856)}, []assignment{hold("w-1", 0, "MIG-x")},
			placementRequest{gpus: 1}, []string{"MIG-y"}, true,
		},
		{
			"MIG: shares pack into a MIG device",
			[]gpu.Device{mig(0, "MIG-x", 40192), dev(1, "B", 81559)}, nil,
			placementRequest{gpus: 1, memoryMiB: 20000}, []string{"MIG-x"}, true,
		},
		{
			"MIG: a replica asking for several GPUs never gets MIG devices",
			[]gpu.Device{mig(0, "MIG-x", 40192), mig(0, "MIG-y", 40192), dev(1, "B", 81559)}, nil,
			placementRequest{gpus: 2}, nil, false,
		},
	} {
		t.Run(tc.name, tc.run)
	}
}

func TestFitsMachine(t *testing.T) {
	box := []gpu.Device{dev(0, "A", 24576), dev(1, "B", 81920, 100)} // free memory does not matter
	for _, tc := range []struct {
		name string
		req  placementRequest
		want string
	}{
		{"cpu", placementRequest{}, ""},
		{"two whole GPUs", placementRequest{gpus: 2}, ""},
		{"three whole GPUs", placementRequest{gpus: 3}, "project needs 3 GPUs, this machine has 2"},
		{"a share that one GPU can hold", placementRequest{gpus: 1, memoryMiB: 40000}, ""},
		{"two shares only one GPU can hold", placementRequest{gpus: 2, memoryMiB: 40000}, "project needs 2 GPUs with 40000 MiB, this machine has 1 that large"},
		{"a share larger than any GPU", placementRequest{gpus: 1, memoryMiB: 90000}, "project needs 1 GPUs with 90000 MiB, this machine has 0 that large"},
		{"a share just under the total, above what is usable", placementRequest{gpus: 1, memoryMiB: 81800}, "project needs 1 GPUs with 81800 MiB, this machine has 0 that large"},
		{"a lost GPU does not count", placementRequest{gpus: 3}, "project needs 3 GPUs, this machine has 2 (and 1 unhealthy: see /v1/status/gpus)"},
		{"one MIG device per replica", placementRequest{gpus: 1, memoryMiB: 9000}, ""},
		{"MIG devices never make up several GPUs", placementRequest{gpus: 2, memoryMiB: 30000}, "project needs 2 GPUs with 30000 MiB, this machine has 1 that large"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := box[1]
			b.DriverReservedMiB = 512
			m := dev(3, "MIG-m", 9856)
			m.MIG = true
			devs := []gpu.Device{box[0], b, m}
			if strings.Contains(tc.name, "lost") {
				lost := dev(2, "L", 81920)
				lost.Problem = "lost (ERROR_GPU_IS_LOST)"
				devs = append(devs, lost)
			}
			err := fitsMachine(devs, tc.req)
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("fitsMachine = %v, want nil", err)
			case tc.want != "" && (err == nil || err.Error() != tc.want || !errors.Is(err, ErrNeedsGPUs)):
				t.Errorf("fitsMachine = %v, want %q wrapping ErrNeedsGPUs", err, tc.want)
			}
		})
	}
}

func TestMinimumsWarnings(t *testing.T) {
	two := []gpu.Device{dev(0, "A", 16384, 0), dev(1, "B", 16384, 0)} // driver's free memory is ignored
	proj := func(id string, min, gpus, mem int) store.Project {
		return store.Project{ID: id, MinReplicas: min, Model: store.ModelSpec{GPUs: gpus, GPUMemoryMiB: mem}}
	}
	for _, tc := range []struct {
		name     string
		cpuSlots int
		projects []store.Project
		want     []string // substrings, one per warning
	}{
		{"nothing", 2, nil, nil},
		{"minimums fit exactly", 2, []store.Project{proj("w", 1, 1, 0), proj("s", 2, 0, 8192), proj("c", 2, 0, 0)}, nil},
		{"max does not count", 1, []store.Project{proj("w", 0, 2, 0), proj("c", 0, 0, 0)}, nil},
		{
			"a whole GPU beside a share",
			2, []store.Project{proj("s", 1, 0, 12000), proj("w", 1, 1, 0)}, nil,
		},
		{
			"one GPU replica too many",
			2, []store.Project{proj("w", 1, 1, 0), proj("x", 2, 1, 0)},
			[]string{"minReplicas need 3 GPU replicas at once but only 2 fit on this machine's 2 GPUs (projects w, x)"},
		},
		{
			"shares fragment",
			2, []store.Project{proj("s", 3, 0, 10000)},
			[]string{"minReplicas need 3 GPU replicas at once but only 2 fit on this machine's 2 GPUs (projects s)"},
		},
		{
			"CPU minimums above cpuSlots",
			2, []store.Project{proj("a", 2, 0, 0), proj("b", 1, 0, 0)},
			[]string{"minReplicas need 3 CPU replicas at once but cpuSlots is 2 (projects a, b)"},
		},
		{
			"others' CPU minimums fill cpuSlots",
			2, []store.Project{proj("a", 1, 0, 0), proj("b", 1, 0, 0), proj("c", 0, 0, 0)},
			[]string{"project c can never run a call: no CPU slot: the minReplicas of projects a, b hold all 2 cpuSlots"},
		},
		{"a CPU slot left beside the minimums", 3, []store.Project{proj("a", 1, 0, 0), proj("b", 1, 0, 0), proj("c", 0, 0, 0)}, nil},
		{
			"others' GPU minimums hold every GPU",
			2, []store.Project{proj("w", 2, 1, 0), proj("x", 0, 1, 0), proj("c", 0, 0, 0)},
			[]string{"project x can never run a call: no GPU: the minReplicas of projects w hold the GPUs its 1 GPUs would need"},
		},
		{
			"no room for a share beside a whole GPU and a share",
			2, []store.Project{proj("w", 1, 1, 0), proj("s", 1, 0, 10000), proj("z", 0, 0, 10000)},
			[]string{"project z can never run a call: no GPU: the minReplicas of projects s, w hold the GPUs its 1 GPUs with 10000 MiB would need"},
		},
		{"a GPU left beside the minimums", 2, []store.Project{proj("w", 1, 1, 0), proj("z", 0, 1, 0)}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := MinimumsWarnings(two, tc.cpuSlots, tc.projects)
			if len(got) != len(tc.want) {
				t.Fatalf("warnings = %q, want %d", got, len(tc.want))
			}
			for i := range got {
				if !strings.Contains(got[i], tc.want[i]) {
					t.Errorf("warning %q, want it to contain %q", got[i], tc.want[i])
				}
			}
		})
	}
}

// TestReleasedGPUsComeBackOnlyAfterADriverRead covers the bookkeeping of an
// exited replica's hold on a real GPU: held until the device has been read
// again, then gone.
func TestReleasedGPUsComeBackOnlyAfterADriverRead(t *testing.T) {
	s := &Scheduler{}
	real := []gpu.Device{dev(0, "A", 16384), dev(1, "B", 16384)}
	real[0].Samples, real[1].Samples = 5, 7
	sim := []gpu.Device{{Index: 0, UUID: "S", MemoryTotalMiB: 16384, MemoryFreeMiB: 16384, Simulated: true}}

	s.releaseGPUs(&rep{id: "sim-1", gpus: []string{"S"}}, sim)
	if len(s.assignments()) != 0 {
		t.Fatalf("a simulated GPU was held after its replica exited: %+v", s.assignments())
	}

	s.releaseGPUs(&rep{id: "w-1", gpus: []string{"A", "B"}}, real)
	if _, ok := place(real, s.assignments(), placementRequest{gpus: 1}); ok {
		t.Fatal("an exited replica's GPUs were free before the driver was read again")
	}
	real[0].Samples++ // A read again; B not yet
	s.pruneReleases(real)
	if got, ok := place(real, s.assignments(), placementRequest{gpus: 2}); ok {
		t.Fatalf("placed %v on B before B was read again", got)
	}
	if got, _ := place(real, s.assignments(), placementRequest{gpus: 1}); !slices.Equal(got, []string{"A"}) {
		t.Fatalf("placed %v, want A (read again since the exit)", got)
	}
	s.pruneReleases(real[:1]) // B vanished from the inventory: nothing to wait for
	if len(s.releasing) != 0 {
		t.Errorf("releases left: %+v", s.releasing)
	}
}
