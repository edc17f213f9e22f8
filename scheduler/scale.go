package scheduler

import (
	"sort"

	"inferd/gpu"
)

// Waiting texts of the status page.
const (
	waitingCPU = "waiting for CPU slot"
	waitingGPU = "waiting for GPU"
)

// schedule is the pass that follows every batch of events: dispatch queued
// calls to ready replicas, stop or time replicas that are idle, then boot what
// is wanted where resources allow, evicting idle replicas of other projects
// for projects that wait.
func (s *Scheduler) schedule() {
	for _, p := range s.order {
		s.dispatch(p)
	}
	for _, p := range s.order {
		s.tidy(p)
	}
	s.scaleUp()
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
	live, keep := p.live(), p.want()
	for _, r := range s.idleReplicas(p) {
		switch {
		case live > p.cfg.MaxReplicas, live > keep && p.cfg.IdleTimeout <= 0:
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
	needs := s.needs[:0]
	any := false
	for _, p := range s.order {
		n := 0
		if !p.deleted && !p.backoffT.armed() && p.cfg.Model.GPUs <= len(devices) {
			n = max(p.want()-p.live(), 0)
		}
		needs = append(needs, n)
		p.waiting = ""
		any = any || n > 0
	}
	s.needs = needs
	if !any {
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
	var waiting []*project
	for k := range s.order {
		i := (start + k) % len(s.order)
		if p := s.order[i]; needs[i] > 0 {
			p.waiting = waitingCPU
			if p.cfg.Model.GPUs > 0 {
				p.waiting = waitingGPU
			}
			waiting = append(waiting, p)
		}
	}
	if len(waiting) > 0 {
		s.evict(waiting, devices)
	}
}

// acquire takes a CPU slot or GPUs for one replica of p.
func (s *Scheduler) acquire(p *project, devices []gpu.Device) (gpus []string, cpuSlot, ok bool) {
	if n := p.cfg.Model.GPUs; n > 0 {
		gpus, ok = place(devices, s.assignments(), placementRequest{gpus: n, memoryMiB: uint64(p.cfg.Model.GPUMemoryMiB)})
		return gpus, false, ok
	}
	if s.cpuUsed < s.cfg.CPUSlots {
		return nil, true, true
	}
	return nil, false, false
}

// evict makes room for waiting projects (in turn order) by stopping the
// least recently used idle replica of another project that is above its
// minReplicas. Resources held by stopping replicas count as coming free, so
// one free-up is never paid for twice; busy replicas and minimums are never
// touched.
func (s *Scheduler) evict(waiting []*project, devices []gpu.Device) {
	cpuAvail := max(s.cfg.CPUSlots-s.cpuUsed, 0)
	gpuAvail := len(devices) - len(s.gpuUsed)
	for _, p := range s.order {
		for _, r := range p.replicas {
			if r.state == stateStopping {
				if r.cpuSlot {
					cpuAvail++
				}
				gpuAvail += len(r.gpus)
			}
		}
	}
	for _, p := range waiting {
		need := p.cfg.Model.GPUs
		if need == 0 {
			if cpuAvail > 0 {
				cpuAvail--
				continue
			}
			if v := s.lruIdle(p, false); v != nil {
				s.log.Info().Str("project", v.p.id).Str("replica", v.id).Str("for", p.id).Msg("evicting idle replica for a waiting project")
				s.cfg.Observer.ReplicaEvicted(v.p.id)
				s.stop(v)
			}
			continue
		}
		for gpuAvail < need {
			v := s.lruIdle(p, true)
			if v == nil {
				break
			}
			s.log.Info().Str("project", v.p.id).Str("replica", v.id).Str("for", p.id).Msg("evicting idle replica for a waiting project")
			s.cfg.Observer.ReplicaEvicted(v.p.id)
			s.stop(v)
			gpuAvail += len(v.gpus)
		}
		if gpuAvail >= need {
			gpuAvail -= need
		}
	}
}

// lruIdle returns the least recently used idle replica, of a project other
// than except that is above its minReplicas and has nothing queued, holding
// GPUs (gpu) or a CPU slot (!gpu); nil if there is none.
func (s *Scheduler) lruIdle(except *project, gpu bool) *rep {
	var best *rep
	for _, q := range s.order {
		if q == except || q.deleted || q.queue.len() > 0 || q.live() <= q.cfg.MinReplicas {
			continue
		}
		for _, r := range q.replicas {
			if !r.live() || !r.idle() || (len(r.gpus) > 0) != gpu {
				continue
			}
			if best == nil || r.idleSince.Before(best.idleSince) {
				best = r
			}
		}
	}
	return best
}
