package scheduler

import (
	"slices"
	"sort"

	"inferd/gpu"
	"inferd/store"
)

// Waiting texts of the status page.
const (
	waitingCPU = "waiting for CPU slot"
	waitingGPU = "waiting for GPU"
)

// schedule is the pass that follows every batch of events: dispatch queued
// calls to ready replicas, stop or time replicas that are idle, then boot what
// is wanted where resources allow, evicting idle replicas of other projects
// for projects that wait. While draining, drainPass replaces it.
func (s *Scheduler) schedule() {
	defer s.pass.reset()
	if s.drain != nil {
		s.drainPass()
		return
	}
	if s.narrowPass() {
		return
	}
	for _, p := range s.order {
		p.quotaWait = ""
		s.dispatch(p)
	}
	for _, p := range s.order {
		s.tidy(p)
		s.tidyParking(p)
	}
	s.scaleUp()
	s.pass.calm = s.settled()
}

// tidy handles p's idle replicas: drained ones stop, those above max stop
// now, least recently used first, and those above what p wants stop when
// their idle timeout passes (at once for idleTimeout 0). Replicas within what
// p wants keep no timer: minReplicas are never timed out.
func (s *Scheduler) tidy(p *project) {
	for _, r := range p.replicas {
		if r.draining && r.idle() {
			s.stop(r)
		}
	}
	if p.deleted {
		return
	}
	s.trimRetiring(p)
	live, keep := p.live(), p.want()
	for _, r := range s.idleReplicas(p) {
		switch {
		case live > p.maxReplicas(), live > keep && p.cfg.IdleTimeout <= 0:
			s.stop(r)
			live--
		case live > keep:
			if !r.idleT.armed() {
				d := seconds(p.cfg.IdleTimeout) - s.clk.Now().Sub(r.idleSince)
				s.arm(&r.idleT, max(d, 0), func(seq uint64) event { return evIdleExpired{r: r, seq: seq} })
			}
		default:
			r.idleT.stop()
		}
	}
}

// scaleUp boots the replicas projects want, as far as CPU slots and GPUs
// allow. When they are scarce, projects take turns one replica at a time,
// starting after the project served last, so that none starves.
func (s *Scheduler) scaleUp() {
	if len(s.order) == 0 {
		return
	}
	devices := s.devices()
	s.pruneReleases(devices)
	needs := s.needs[:0]
	any := false
	for _, p := range s.order {
		n := 0
		if !p.deleted && !p.backoffT.armed() {
			n = max(p.want()-p.live(), 0)
		}
		if n > 0 && fitsMachine(devices, requestOf(p.cfg.Model)) != nil {
			n = 0 // asked only when it wants one: this runs after every event
		}
		needs = append(needs, n)
		any = any || n > 0
	}
	s.needs = needs
	if !any {
		s.setWaiting(nil, nil)
		s.scaleLow(devices)
		return
	}
	start := sort.Search(len(s.order), func(i int) bool { return s.order[i].id > s.rrLast }) % len(s.order)
	for progress := true; progress; {
		progress = false
		for k := range s.order {
			i := (start + k) % len(s.order)
			p := s.order[i]
			if needs[i] == 0 {
				continue
			}
			if why := s.bootBlocked(p); why != "" {
				p.quotaWait = why // waits for its own team, evicts nobody
				continue
			}
			gpus, cpu, ok := s.acquire(p, devices)
			if !ok {
				continue
			}
			s.boot(p, gpus, cpu)
			needs[i]--
			s.rrLast = p.id
			progress = true
		}
	}
	for i, p := range s.order {
		if needs[i] > 0 && p.retiringCount() > 0 {
			s.yieldOld(p) // no room beside its old replicas (rollout.go)
		}
	}
	var waiting []*project
	for k := range s.order {
		if i := (start + k) % len(s.order); needs[i] > 0 && s.order[i].quotaWait == "" {
			waiting = append(waiting, s.order[i])
		}
	}
	s.setWaiting(waiting, devices)
	if len(waiting) > 0 {
		s.evict(waiting, devices)
		return
	}
	s.scaleLow(devices)
}

// scaleLow boots replicas for queued low-priority calls, only into capacity
// that no other call waits for (scaleUp calls it when no project waits) and
// never by evicting: batch work soaks up idle capacity. A low call of a
// project with no replica still gets one when a slot or GPU is free.
func (s *Scheduler) scaleLow(devices []gpu.Device) {
	for _, p := range s.order {
		if p.deleted || p.backoffT.armed() || p.queue.lenLow() == 0 || fitsMachine(devices, requestOf(p.cfg.Model)) != nil {
			continue
		}
		for n := p.wantLow() - p.live(); n > 0; n-- {
			if s.bootBlocked(p) != "" {
				break // the team's quota holds low calls back too
			}
			gpus, cpu, ok := s.acquire(p, devices)
			if !ok {
				break
			}
			s.boot(p, gpus, cpu)
		}
	}
}

// setWaiting records why the waiting projects wait (for the status), and
// polls the inventory while one waits for GPU memory that only a fresh
// driver reading can show: a stopped replica's, or memory used outside
// inferd. Simulated GPUs change only with inferd's own events.
func (s *Scheduler) setWaiting(waiting []*project, devices []gpu.Device) {
	var demands []demand // read once, only when a project waits with no replica
	for _, p := range s.order {
		was, wasHeld := p.waiting, p.heldBy
		p.waiting, p.heldBy = "", nil
		if slices.Contains(waiting, p) {
			p.waiting = waitingCPU
			if requestOf(p.cfg.Model).gpus > 0 {
				p.waiting = waitingGPU
			}
			if p.live() == 0 {
				if demands == nil {
					demands = s.demands()
				}
				p.heldBy = heldByMinimums(devices, s.cpuSlots(), demands, p.id)
			}
		}
		switch {
		case p.heldBy != nil && (wasHeld == nil || p.heldBy.Named != wasHeld.Named):
			// The daemon's log is the operator's: it names the holders.
			s.log.Warn().Str("project", p.id).Int("queued", p.queue.len()).Str("reason", p.heldBy.Named).
				Msg("project can run no call: other projects' minimum replicas hold what it needs")
		case p.waiting != was && p.waiting != "":
			s.log.Info().Str("project", p.id).Int("queued", p.queue.len()).Msg(p.waiting)
		}
	}
	poll := false
	for _, p := range waiting {
		poll = poll || p.waiting == waitingGPU
	}
	poll = poll && slices.ContainsFunc(devices, func(d gpu.Device) bool { return !d.Simulated })
	switch {
	case !poll:
		s.gpuPoll.stop()
	case !s.gpuPoll.armed():
		s.arm(&s.gpuPoll, s.cfg.GPUPoll, func(seq uint64) event { return evGPUPoll{seq: seq} })
	}
}

// acquire takes a CPU slot or GPUs for one replica of p.
func (s *Scheduler) acquire(p *project, devices []gpu.Device) (gpus []string, cpuSlot, ok bool) {
	return s.fit(p.cfg.Model, p.id, devices)
}

// fit is the one fit rule: the CPU slot or the GPUs (placement.go's place,
// spread over project's replicas) a replica of model m would get now, and
// whether it fits at all. The loop holds the state it reads.
func (s *Scheduler) fit(m store.ModelSpec, project string, devices []gpu.Device) (gpus []string, cpuSlot, ok bool) {
	if req := requestOf(m); req.gpus > 0 {
		req.project = project // spread over the GPUs
		held := s.assignments()
		s.attribute(held, devices)
		gpus, ok = place(devices, held, req)
		return gpus, false, ok
	}
	if s.cpuUsed < s.cpuSlots() {
		return nil, true, true
	}
	return nil, false, false
}

// FitsNow reports whether a replica of model m could boot here now, by the
// fit rule a scale-up follows (fit): a free CPU slot, or GPUs that
// placement would hand out. Cluster mode's router asks it whether a
// project with no placement yet may run here. False while the loop is
// not running.
func (s *Scheduler) FitsNow(m store.ModelSpec) bool {
	if !s.ready.Load() {
		return false
	}
	fits := false
	s.control(func() { _, _, fits = s.fit(m, "", s.devices()) })
	return fits
}

// evict makes room for waiting projects (in turn order) by stopping the
// least recently used idle replicas of other projects that are above their
// minReplicas. Busy replicas and minimums are never touched.
//
// It plans on inferd's own bookkeeping: what stopping and exited replicas
// hold counts as coming free, so one free-up is never paid for twice, and
// each waiting project's replica is placed in the plan before the next
// project's turn. A GPU project evicts only when stopping every replica it
// may stop would make its request fit, so no replica is stopped in vain.
func (s *Scheduler) evict(waiting []*project, devices []gpu.Device) {
	cpuAvail := max(s.cpuSlots()-s.cpuUsed, 0)
	planDevs := emptied(devices)
	var plan []assignment // GPU holds that stay: live replicas
	for _, p := range s.order {
		for _, r := range p.replicas {
			if r.state == stateStopping {
				if r.cpuSlot {
					cpuAvail++
				}
				continue
			}
			if r.holdsGPUs() {
				plan = append(plan, assignment{replica: r.id, gpus: r.gpus, memoryMiB: r.gpuMemMiB})
			}
		}
	}
	for _, p := range waiting {
		if p.queue.len() == p.queue.lenLow() {
			continue // a minimum alone waits; only calls evict, and low ones never do
		}
		req := requestOf(p.cfg.Model)
		if req.gpus == 0 {
			if cpuAvail > 0 {
				cpuAvail--
				continue
			}
			if v := s.lruIdle(p, false, nil); v != nil {
				s.evictReplica(v, p)
			}
			continue
		}
		planned := assignment{replica: "planned:" + p.id, memoryMiB: req.memoryMiB}
		if gpus, ok := place(planDevs, plan, req); ok {
			planned.gpus = gpus
			plan = append(plan, planned)
			continue
		}
		if gpus, victims := s.victims(p, req, planDevs, plan); victims != nil {
			for _, v := range victims {
				s.evictReplica(v, p)
			}
			planned.gpus = gpus
			plan = append(without(plan, victims), planned)
		}
	}
}

// victims chooses the idle replicas to stop so that req fits in plan: the
// least recently used first, as many as needed, then without those whose
// stop turns out not to help. It returns where req would go, and nil
// victims when even stopping every candidate would not make room.
func (s *Scheduler) victims(p *project, req placementRequest, devices []gpu.Device, plan []assignment) ([]string, []*rep) {
	var cands []*rep
	for v := s.lruIdle(p, true, cands); v != nil; v = s.lruIdle(p, true, cands) {
		cands = append(cands, v)
	}
	n := 0
	for ; n < len(cands); n++ {
		if _, ok := place(devices, without(plan, cands[:n+1]), req); ok {
			break
		}
	}
	if n == len(cands) {
		return nil, nil
	}
	chosen := slices.Clone(cands[:n+1])
	for i := len(chosen) - 2; i >= 0; i-- { // the last one was needed
		fewer := slices.Delete(slices.Clone(chosen), i, i+1)
		if _, ok := place(devices, without(plan, fewer), req); ok {
			chosen = fewer
		}
	}
	gpus, _ := place(devices, without(plan, chosen), req)
	return gpus, chosen
}

func (s *Scheduler) evictReplica(v *rep, forP *project) {
	s.log.Info().Str("project", v.p.id).Str("replica", v.id).Str("for", forP.id).Msg("evicting idle replica for a waiting project")
	s.cfg.Observer.ReplicaEvicted(v.p.id)
	s.stop(v)
}

// without returns the assignments of plan not held by victims, as a new slice.
func without(plan []assignment, victims []*rep) []assignment {
	return slices.DeleteFunc(slices.Clone(plan), func(a assignment) bool {
		return slices.ContainsFunc(victims, func(v *rep) bool { return v.id == a.replica })
	})
}

// lruIdle returns the least recently used idle replica, of a project other
// than except that is above its minReplicas and has nothing queued, holding
// GPUs (gpu) or a CPU slot (!gpu), and not among taken; nil if there is
// none. A project's minimum counts the replicas in taken as gone.
func (s *Scheduler) lruIdle(except *project, gpu bool, taken []*rep) *rep {
	var best *rep
	for _, q := range s.order {
		if q == except || q.deleted || q.queue.len() > 0 || !s.mayEvictFor(except, q, gpu) {
			continue
		}
		live := q.live()
		for _, v := range taken {
			if v.p == q {
				live--
			}
		}
		if live <= q.minReplicas() {
			continue
		}
		for _, r := range q.replicas {
			if !r.live() || !r.idle() || (len(r.gpus) > 0) != gpu || slices.Contains(taken, r) {
				continue
			}
			if best == nil || r.idleSince.Before(best.idleSince) {
				best = r
			}
		}
	}
	return best
}
