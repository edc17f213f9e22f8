package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"inferd/gpu"
	"inferd/store"
)

// assignment is one replica's hold on GPUs: a running or stopping replica,
// or one that has exited while the driver has not yet shown its memory back.
type assignment struct {
	replica   string
	gpus      []string // UUIDs
	memoryMiB uint64   // per GPU; 0 = the whole GPU
}

// placementRequest is what one replica asks for: gpus GPUs, each whole
// (memoryMiB 0) or shared with other replicas by memoryMiB.
type placementRequest struct {
	gpus      int
	memoryMiB uint64
}

// requestOf reads a model spec's GPU needs. gpuMemoryMiB without gpus means
// a share of one GPU.
func requestOf(m store.ModelSpec) placementRequest {
	r := placementRequest{gpus: m.GPUs, memoryMiB: uint64(max(m.GPUMemoryMiB, 0))}
	if r.memoryMiB > 0 && r.gpus == 0 {
		r.gpus = 1
	}
	return r
}

func (r placementRequest) String() string {
	if r.memoryMiB == 0 {
		return fmt.Sprintf("%d GPUs", r.gpus)
	}
	return fmt.Sprintf("%d GPUs with %d MiB", r.gpus, r.memoryMiB)
}

// place chooses the GPUs for a replica, given the machine's devices and what
// is already assigned, or reports false when the request does not fit now.
//
// A GPU's free memory is the smaller of what the driver last reported free
// and its total minus what inferd has handed out (a whole-GPU holder takes
// all of it). So memory that a replica has not allocated yet is not given
// twice, and memory that an exited replica held counts only once the driver
// shows it back.
//
// Whole GPUs go to devices nobody holds, lowest index first. Shares go best
// fit: the devices with the least free memory that still fits, so that
// whole GPUs stay whole for requests that need them.
//
// It is a pure function so that placement rules can be tested as tables.
func place(devices []gpu.Device, held []assignment, req placementRequest) ([]string, bool) {
	if req.gpus <= 0 {
		return nil, true
	}
	use := usage(held)
	type cand struct {
		d    gpu.Device
		free uint64
	}
	cands := make([]cand, 0, len(devices))
	for _, d := range devices {
		u := use[d.UUID]
		switch {
		case req.memoryMiB == 0 && (u.whole || u.memMiB > 0):
			continue
		case req.memoryMiB == 0:
			cands = append(cands, cand{d: d})
		case u.whole:
			continue
		default:
			free := min(d.MemoryFreeMiB, d.MemoryTotalMiB-u.reservedMiB(d.MemoryTotalMiB))
			if free >= req.memoryMiB {
				cands = append(cands, cand{d: d, free: free})
			}
		}
	}
	if len(cands) < req.gpus {
		return nil, false
	}
	slices.SortFunc(cands, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.free, b.free), cmp.Compare(a.d.Index, b.d.Index))
	})
	out := make([]string, req.gpus)
	for i := range out {
		out[i] = cands[i].d.UUID
	}
	return out, true
}

// gpuUse is what inferd has handed out on one GPU.
type gpuUse struct {
	whole  bool
	memMiB uint64
}

// reservedMiB is how much of a GPU of total MiB this hands out.
func (u gpuUse) reservedMiB(total uint64) uint64 {
	if u.whole {
		return total
	}
	return min(u.memMiB, total)
}

func usage(held []assignment) map[string]gpuUse {
	use := make(map[string]gpuUse, len(held))
	for _, a := range held {
		for _, u := range a.gpus {
			g := use[u]
			if a.memoryMiB == 0 {
				g.whole = true
			}
			g.memMiB += a.memoryMiB
			use[u] = g
		}
	}
	return use
}

// fitsMachine reports whether req could ever be placed on devices, with
// nothing else running: enough GPUs, each big enough. It returns the error
// users see otherwise.
func fitsMachine(devices []gpu.Device, req placementRequest) error {
	if req.gpus == 0 {
		return nil
	}
	have := 0
	for _, d := range devices {
		if d.MemoryTotalMiB >= req.memoryMiB {
			have++
		}
	}
	if have >= req.gpus {
		return nil
	}
	return &needsGPUsError{need: req.gpus, have: have, memoryMiB: req.memoryMiB}
}

// emptied returns devices as they are with nothing running: free = total.
// Planning (eviction, apply-time checks) works on inferd's own bookkeeping.
func emptied(devices []gpu.Device) []gpu.Device {
	out := slices.Clone(devices)
	for i := range out {
		out[i].MemoryFreeMiB = out[i].MemoryTotalMiB
	}
	return out
}

// assignments lists the GPU holdings of every replica, stopping ones
// included (a GPU is free only once its process has exited), plus the
// holdings of exited replicas that the driver has not shown back yet.
func (s *Scheduler) assignments() []assignment {
	held := s.held[:0]
	for _, p := range s.order {
		for _, r := range p.replicas {
			if len(r.gpus) > 0 {
				held = append(held, assignment{replica: r.id, gpus: r.gpus, memoryMiB: r.gpuMemMiB})
			}
		}
	}
	for _, rl := range s.releasing {
		held = append(held, rl.assignment)
	}
	s.held = held
	return held
}

// release is the hold of an exited replica on real GPUs, kept until every
// one of its devices has been read again after the exit.
type release struct {
	assignment
	samples map[string]uint64 // per UUID: the device's read count at the exit
}

// releaseGPUs turns an exited replica's hold on real GPUs into a release.
// Simulated GPUs have no driver to wait for: their memory is back at once.
func (s *Scheduler) releaseGPUs(r *rep, devices []gpu.Device) {
	rl := release{assignment: assignment{replica: r.id, memoryMiB: r.gpuMemMiB}, samples: map[string]uint64{}}
	for _, d := range devices {
		if !d.Simulated && slices.Contains(r.gpus, d.UUID) {
			rl.gpus = append(rl.gpus, d.UUID)
			rl.samples[d.UUID] = d.Samples
		}
	}
	if len(rl.gpus) > 0 {
		s.releasing = append(s.releasing, rl)
	}
}

// pruneReleases drops the GPUs of releases whose devices have been read
// since the exit: from then on the driver's free memory tells the truth. A
// device that vanished from the inventory is dropped too.
func (s *Scheduler) pruneReleases(devices []gpu.Device) {
	if len(s.releasing) == 0 {
		return
	}
	samples := make(map[string]uint64, len(devices))
	for _, d := range devices {
		samples[d.UUID] = d.Samples
	}
	for i := range s.releasing {
		rl := &s.releasing[i]
		rl.gpus = slices.DeleteFunc(rl.gpus, func(u string) bool {
			now, ok := samples[u]
			return !ok || now > rl.samples[u]
		})
	}
	s.releasing = slices.DeleteFunc(s.releasing, func(rl release) bool { return len(rl.gpus) == 0 })
}

// CapacityWarnings says whether the minReplicas of projects can all run at
// once on this machine's GPUs and CPU slots; nil when they can. It reads no
// loop state, so it is safe to call from any goroutine, and it rejects
// nothing: a minimum that does not fit just waits.
func (s *Scheduler) CapacityWarnings(projects []store.Project) []string {
	return minimumsWarnings(s.devices(), s.cpuSlots(), projects)
}

// minimumsWarnings names the projects whose minReplicas cannot fit beside
// the others': their replicas would wait for GPUs (or CPU slots) that other
// projects' minimums never give back. Minimums are packed biggest first.
func minimumsWarnings(devices []gpu.Device, cpuSlots int, projects []store.Project) []string {
	devices = emptied(devices)
	type want struct {
		id  string
		req placementRequest
	}
	var wants []want
	cpu := 0
	var cpuProjects []string
	for _, p := range projects {
		req := requestOf(p.Model)
		if req.gpus == 0 {
			if p.MinReplicas > 0 {
				cpu += p.MinReplicas
				cpuProjects = append(cpuProjects, p.ID)
			}
			continue
		}
		for range p.MinReplicas {
			wants = append(wants, want{id: p.ID, req: req})
		}
	}
	// Biggest first: whole GPUs, then more GPUs, then more memory.
	slices.SortStableFunc(wants, func(a, b want) int {
		return cmp.Or(
			cmp.Compare(min(a.req.memoryMiB, 1), min(b.req.memoryMiB, 1)),
			cmp.Compare(b.req.gpus, a.req.gpus),
			cmp.Compare(b.req.memoryMiB, a.req.memoryMiB))
	})
	var held []assignment
	var gpuProjects []string
	for _, w := range wants {
		if !slices.Contains(gpuProjects, w.id) {
			gpuProjects = append(gpuProjects, w.id)
		}
		if gpus, ok := place(devices, held, w.req); ok {
			held = append(held, assignment{replica: w.id, gpus: gpus, memoryMiB: w.req.memoryMiB})
		}
	}
	var warnings []string
	if len(held) < len(wants) {
		slices.Sort(gpuProjects)
		warnings = append(warnings, fmt.Sprintf("minReplicas need %d GPU replicas at once but only %d fit on this machine's %d GPUs (projects %s); the rest wait until GPUs come free",
			len(wants), len(held), len(devices), strings.Join(gpuProjects, ", ")))
	}
	if cpu > cpuSlots {
		warnings = append(warnings, fmt.Sprintf("minReplicas need %d CPU replicas at once but cpuSlots is %d (projects %s); the rest wait for a slot",
			cpu, cpuSlots, strings.Join(cpuProjects, ", ")))
	}
	return warnings
}
