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
	project   string   // the replica's project; "" for holds that do not count for spreading
	gpus      []string // UUIDs
	memoryMiB uint64   // per GPU; 0 = the whole GPU
	// group is the replica's process group (its own pid: a replica leads
	// its group); 0 until it has been launched.
	group int
	// pids are the processes the driver lists on GPUs that belong to this
	// replica (see attribute); what they use is what it has allocated.
	pids []int
}

// placementRequest is what one replica asks for: gpus GPUs, each whole
// (memoryMiB 0) or shared with other replicas by memoryMiB.
type placementRequest struct {
	gpus      int
	memoryMiB uint64
	// project, when set, is whose replica it is: a share goes first to the
	// GPUs that hold the fewest of that project's replicas.
	project string
}

// requestOf reads a model spec's GPU needs (store.ModelSpec.GPUDemand).
func requestOf(m store.ModelSpec) placementRequest {
	d := m.GPUDemand()
	return placementRequest{gpus: d.GPUs, memoryMiB: uint64(d.MemoryMiB)}
}

func (r placementRequest) String() string {
	if r.memoryMiB == 0 {
		return fmt.Sprintf("%d GPUs", r.gpus)
	}
	return fmt.Sprintf("%d GPUs with %d MiB", r.gpus, r.memoryMiB)
}

// eligible reports whether d may ever serve req: a process uses one MIG
// device at most (CUDA sees only the first MIG-<uuid> it is given), so a
// replica asking for several GPUs gets whole GPUs, never MIG devices.
func (r placementRequest) eligible(d gpu.Device) bool {
	return !d.MIG || r.gpus <= 1
}

// place chooses the GPUs for a replica, given the machine's devices and what
// is already assigned, or reports false when the request does not fit now.
// Unhealthy devices (lost, unreadable) get nothing.
//
// A GPU's free memory for a share is what the driver last reported free,
// less what each replica holding a share of it has reserved but not yet
// allocated (its gpuMemoryMiB minus what the driver lists its processes as
// using, CUDA context included). So memory a replica has not allocated yet
// is not given twice, a replica that uses more than it declared takes the
// excess from the driver's free memory, and memory used outside inferd
// counts. It is further capped by the usable memory minus every share
// handed out, in case the driver's reading is older than a hand-out. An
// exited replica's hold counts until the driver has been read again after
// the exit (its processes are then gone from the list and its memory back
// in the free figure).
//
// A whole GPU goes only to a device nobody in inferd holds, where the
// driver lists no compute process and shows at most wholeSlackMiB of its
// usable memory in use: a GPU that something outside inferd fills is not
// handed out whole.
//
// Whole GPUs go lowest index first. Shares spread: the devices that hold
// the fewest replicas of the request's project first, so that one GPU's
// failure takes as few of them as can be (a project's minReplicas on one
// node go to different GPUs where they fit); among those, best fit: the
// devices with the least free memory that still fits, so that whole GPUs
// stay whole for requests that need them.
//
// It is a pure function so that placement rules can be tested as tables.
func place(devices []gpu.Device, held []assignment, req placementRequest) ([]string, bool) {
	if req.gpus <= 0 {
		return nil, true
	}
	type cand struct {
		d    gpu.Device
		free uint64
		same int // replicas of req.project on it
	}
	cands := make([]cand, 0, len(devices))
	for _, d := range devices {
		if !d.Healthy() || !req.eligible(d) {
			continue
		}
		l := loadOf(d, held)
		if req.memoryMiB == 0 {
			if l.wholeFree(d) {
				cands = append(cands, cand{d: d})
			}
			continue
		}
		if l.whole {
			continue
		}
		free := min(d.MemoryFreeMiB-min(l.unusedMiB, d.MemoryFreeMiB), d.UsableMiB()-min(l.sharedMiB, d.UsableMiB()))
		if free >= req.memoryMiB {
			cands = append(cands, cand{d: d, free: free, same: req.sameProject(d, held)})
		}
	}
	if len(cands) < req.gpus {
		return nil, false
	}
	// Stable: a GPU's MIG devices share its index and keep their order.
	slices.SortStableFunc(cands, func(a, b cand) int {
		return cmp.Or(cmp.Compare(a.same, b.same), cmp.Compare(a.free, b.free), cmp.Compare(a.d.Index, b.d.Index))
	})
	out := make([]string, req.gpus)
	for i := range out {
		out[i] = cands[i].d.UUID
	}
	return out, true
}

// sameProject counts the holds on d of replicas of req's project.
func (r placementRequest) sameProject(d gpu.Device, held []assignment) int {
	n := 0
	for _, a := range held {
		if r.project != "" && a.project == r.project && slices.Contains(a.gpus, d.UUID) {
			n++
		}
	}
	return n
}

// load is what is on one device, as placement sees it.
type load struct {
	whole     bool   // a whole-GPU replica holds it
	sharedMiB uint64 // the shares handed out on it, summed
	// unusedMiB: of the shares, what the holders' processes have not
	// allocated yet.
	unusedMiB uint64
	// foreign: the driver lists a compute process on it that belongs to
	// none of its holders.
	foreign bool
}

// loadOf reads d's load from the holds on it and the driver's process list.
func loadOf(d gpu.Device, held []assignment) load {
	var l load
	var mine []int
	for _, a := range held {
		if !slices.Contains(a.gpus, d.UUID) {
			continue
		}
		if a.memoryMiB == 0 {
			l.whole = true
			continue
		}
		l.sharedMiB += a.memoryMiB
		var used uint64
		for _, p := range d.Processes {
			if slices.Contains(a.pids, p.Pid) {
				used += p.UsedMiB
				mine = append(mine, p.Pid)
			}
		}
		l.unusedMiB += a.memoryMiB - min(used, a.memoryMiB)
	}
	for _, p := range d.Processes {
		if !slices.Contains(mine, p.Pid) {
			l.foreign = true
		}
	}
	return l
}

// wholeFree reports whether d can be handed out whole: nobody in inferd
// holds it, and the driver shows nothing else on it.
func (l load) wholeFree(d gpu.Device) bool {
	if l.whole || l.sharedMiB > 0 || l.foreign {
		return false
	}
	usable := d.UsableMiB()
	return d.MemoryFreeMiB+wholeSlackMiB(usable) >= usable
}

// wholeSlackMiB is how much of a GPU's usable memory may read as in use
// while nobody holds it, for it still to count as whole: drivers without
// GetMemoryInfo_v2 count their own reservation (a few hundred MiB) as used,
// and processes in other PID namespaces use memory without being listed.
// 1/32 of the memory, at least 512 MiB.
func wholeSlackMiB(usable uint64) uint64 { return max(usable/32, 512) }

// reservedMiB is how much of d inferd has handed out under l.
func (l load) reservedMiB(d gpu.Device) uint64 {
	if l.whole {
		return d.MemoryTotalMiB
	}
	return min(l.sharedMiB, d.MemoryTotalMiB)
}

// fitsMachine reports whether req could ever be placed on devices, with
// nothing else running: enough healthy GPUs, each with enough usable memory
// (driver-reserved memory is not), and no MIG devices for a replica that
// asks for several GPUs. It returns the error users see otherwise.
func fitsMachine(devices []gpu.Device, req placementRequest) error {
	if req.gpus == 0 {
		return nil
	}
	have, unhealthy := 0, 0
	for _, d := range devices {
		switch {
		case !req.eligible(d):
		case !d.Healthy():
			unhealthy++
		case d.UsableMiB() >= req.memoryMiB:
			have++
		}
	}
	if have >= req.gpus {
		return nil
	}
	return &needsGPUsError{need: req.gpus, have: have, memoryMiB: req.memoryMiB, unhealthy: unhealthy}
}

// emptied returns devices as they are with nothing running: all usable
// memory free, no processes. Planning (eviction, apply-time checks) works
// on inferd's own bookkeeping.
func emptied(devices []gpu.Device) []gpu.Device {
	out := slices.Clone(devices)
	for i := range out {
		out[i].MemoryFreeMiB = out[i].UsableMiB()
		out[i].Processes = nil
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
			if r.holdsGPUs() {
				held = append(held, assignment{replica: r.id, project: p.id, gpus: r.gpus, memoryMiB: r.gpuMemMiB, group: r.info.Pid})
			}
		}
	}
	for _, rl := range s.releasing {
		held = append(held, rl.assignment)
	}
	s.held = held
	return held
}

// processGrouper is a backend whose replicas are OS process groups led by
// their Info().Pid. It tells the group of any pid, so that GPU processes a
// model forks count as the model's.
type processGrouper interface {
	ProcessGroup(pid int) (pgid int, ok bool)
}

// attribute tells each hold which of the processes the driver lists on the
// devices are its own: those in its replica's process group. A backend
// that cannot tell groups (and a process that has exited) matches by the
// replica's own pid only.
func (s *Scheduler) attribute(held []assignment, devices []gpu.Device) {
	var groups map[int]int // pid → group, one lookup per pid
	for _, d := range devices {
		for _, p := range d.Processes {
			if _, done := groups[p.Pid]; done {
				continue
			}
			if groups == nil {
				groups = map[int]int{}
			}
			groups[p.Pid] = p.Pid
			if g, ok := s.backend.(processGrouper); ok {
				if pgid, ok := g.ProcessGroup(p.Pid); ok {
					groups[p.Pid] = pgid
				}
			}
		}
	}
	for i := range held {
		held[i].pids = nil
		for pid, g := range groups {
			if held[i].group != 0 && g == held[i].group {
				held[i].pids = append(held[i].pids, pid)
			}
		}
	}
}

// gpuRefresher is a backend that can have its GPUs read again at once.
type gpuRefresher interface{ RefreshGPUs() }

// release is the hold of an exited replica on real GPUs, kept until every
// one of its devices has been read again after the exit.
type release struct {
	assignment
	samples map[string]uint64 // per UUID: the device's read count at the exit
}

// releaseGPUs turns an exited replica's hold on real GPUs into a release,
// and asks the backend to read its GPUs again: after the release has
// recorded the read counts, so that this read is the one it waits for. Simulated GPUs have no driver
// to wait for: their memory is back at once.
func (s *Scheduler) releaseGPUs(r *rep, devices []gpu.Device) {
	rl := release{assignment: assignment{replica: r.id, memoryMiB: r.gpuMemMiB, group: r.info.Pid}, samples: map[string]uint64{}}
	for _, d := range devices {
		if !d.Simulated && slices.Contains(r.gpus, d.UUID) {
			rl.gpus = append(rl.gpus, d.UUID)
			rl.samples[d.UUID] = d.Samples
		}
	}
	if len(rl.gpus) > 0 {
		s.releasing = append(s.releasing, rl)
		// Its memory shows back at the next driver read: ask for one now
		// rather than at the next refresh interval.
		if f, ok := s.backend.(gpuRefresher); ok {
			f.RefreshGPUs()
		}
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
	return MinimumsWarnings(s.devices(), s.cpuSlots(), projects)
}

// MinimumsWarnings names the projects whose minReplicas cannot fit beside
// the others': their replicas would wait for GPUs (or CPU slots) that other
// projects' minimums never give back. Minimums are packed biggest first.
// It also names each project without a minimum that can get no CPU slot or
// GPU at all beside the others' minimums (heldWarnings). apply with no
// daemon and doctor call it with the machine's devices and cpuSlots.
func MinimumsWarnings(devices []gpu.Device, cpuSlots int, projects []store.Project) []string {
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
	slices.SortStableFunc(wants, func(a, b want) int { return biggestFirst(a.req, b.req) })
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
	return append(warnings, heldWarnings(devices, cpuSlots, projects)...)
}
