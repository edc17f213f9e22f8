package scheduler

import (
	"fmt"
	"math"
	"slices"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// Queue ETA and waitingFor (DESIGN.md "Batching, usage, ETA"): a lookup of a
// queued call says, besides its state, when the call is likely to have
// finished (Call.ETAMs) and why it waits (Call.WaitingFor), from the loop's
// own state: the queue ahead of it, the project's replicas and what they
// run, its measured service and boot times, its team's quota and who holds
// the CPU slots and GPUs it waits for. view computes them for the one call
// looked up, in time linear in the project's replicas, so a lookup costs
// the loop little.

// The WaitingFor codes. Texts say the same for people, with figures.
const (
	WaitBooting      = "booting"             // its replica is booting: "replica booting (12.1 s of a usual 14 s)"
	WaitBuilding     = "buildingEnvironment" // its replica's Python environment is being built: "building environment (40.2 s so far)"
	WaitBootFailed   = "bootFailed"          // boots failed and are retried (the message says which attempt)
	WaitRestarting   = "restarting"          // a replica crashed; the next boots after a backoff
	WaitReplicasBusy = "replicasBusy"        // "all 2 replicas busy (next free in ~0.8 s)", "its replica busy"
	WaitMaxReplicas  = "maxReplicas"         // "maxReplicas 3 reached (all 3 busy, next free in ~0.8 s)"
	WaitTeamQuota    = "teamQuota"           // "team acme quota runningCalls 4/4"
	WaitHeldByIdle   = "heldByIdle"          // "GPU held by an idle replica of another project (evictable in 20 s)"
	WaitFreeing      = "freeing"             // "GPU being freed: an idle replica of another project is stopping"
	WaitCapacity     = "capacity"            // "all 4 CPU slots busy with other projects' calls", "… its own replicas hold all 2 cpuSlots"
	WaitNext         = "next"                // nothing holds it: it is about to be dispatched
)

// samples keeps the last few durations of one kind and averages them.
type samples struct {
	xs   []float64 // seconds
	next int
}

// Window sizes: a project's service time is the mean of its last 32 runs,
// its boot time that of its last 4 boots.
const (
	runWindow  = 32
	bootWindow = 4
)

func (w *samples) add(d time.Duration, size int) {
	if len(w.xs) < size {
		w.xs = append(w.xs, d.Seconds())
		return
	}
	w.xs[w.next] = d.Seconds()
	w.next = (w.next + 1) % size
}

// mean is the average, false before any sample.
func (w *samples) mean() (time.Duration, bool) {
	if len(w.xs) == 0 {
		return 0, false
	}
	sum := 0.0
	for _, x := range w.xs {
		sum += x
	}
	return time.Duration(sum / float64(len(w.xs)) * float64(time.Second)), true
}

// spread is the 10th and the 90th percentile of the samples (nearest rank,
// the lower one rounded down and the upper one up), false before any
// sample: how far a run may fall from the mean, for the range of an ETA.
func (w *samples) spread() (lo, hi time.Duration, ok bool) {
	if len(w.xs) == 0 {
		return 0, 0, false
	}
	xs := slices.Sorted(slices.Values(w.xs))
	last := float64(len(xs) - 1)
	at := func(i int) time.Duration { return time.Duration(xs[i] * float64(time.Second)) }
	return at(int(math.Floor(0.1 * last))), at(int(math.Ceil(0.9 * last))), true
}

// estimate is a queued call's ETA: when it has likely finished, from the
// project's mean run time (ms), and the range from its 10th and 90th
// percentile runs (lo, hi), all in milliseconds from now.
type estimate struct{ ms, lo, hi int64 }

// measured are a project's recent run and boot times, what its estimates
// come from.
type measured struct {
	runs, boots samples
}

func (m *measured) ran(d time.Duration)    { m.runs.add(d, runWindow) }
func (m *measured) booted(d time.Duration) { m.boots.add(d, bootWindow) }

// explain says why queued call c, pos calls from the head of its queue,
// waits, and estimates how long until it has finished (nil when nothing
// measured says).
func (s *Scheduler) explain(c *call, pos int, now time.Time) (*store.Wait, *estimate) {
	p := c.p
	svc, svcOK := p.est.runs.mean()
	boot, bootOK := p.est.boots.mean()
	conc := p.callsPerReplica() // a batching replica runs a batch of calls per slot

	// The project's slots (room for one call on one replica) and when each
	// is free, from now; unknown ones are left out.
	var free []time.Duration
	var ready, busy, booting, parked, building int
	var bootElapsed, buildElapsed time.Duration
	var bootCheck string // what the latest health check of a booting replica found
	nextFree := time.Duration(math.MaxInt64)
	for _, r := range p.replicas {
		if !r.live() || r.exited() {
			continue
		}
		switch r.state {
		case stateReady:
			ready++
			// Room in calls: each free slot takes one call, or a batch
			// of up to maxSize; a batch in flight holds its slot however
			// few calls it carries (slotsUsed).
			perSlot := conc / p.concurrency()
			room := (p.concurrency() - r.slotsUsed()) * perSlot
			if room <= 0 {
				busy++
			}
			for range max(room, 0) {
				free = append(free, 0)
			}
			first := residual(svc, 0) // when its first call ends
			for cc := range r.calls {
				left := residual(svc, now.Sub(cc.c.Dispatched))
				nextFree = min(nextFree, left)
				first = min(first, left)
				if svcOK {
					free = append(free, left)
				}
			}
			// A batch that is not full frees the room of maxSize calls
			// when it returns, more than the calls it carries.
			if short := r.batches*perSlot - r.batched; svcOK && short > 0 {
				for range short {
					free = append(free, first)
				}
			}
		case stateParking, stateParked, stateRestoring:
			parked++ // parking.go: restored for the call (its time is not measured)
		case stateBooting:
			booting++
			if r.phase != "" {
				building++
				buildElapsed = max(buildElapsed, now.Sub(r.phaseSince))
				continue // how long a build takes is not a boot's
			}
			el := now.Sub(r.started)
			bootElapsed = max(bootElapsed, el)
			if r.inst != nil && bootCheck == "" {
				bootCheck = r.inst.BootProblem().Text
			}
			if bootOK {
				for range conc {
					free = append(free, residual(boot, el))
				}
			}
		}
	}
	eta := func(extra ...time.Duration) *estimate {
		if !svcOK {
			return nil
		}
		slots := append(slices.Clone(free), extra...)
		if len(slots) == 0 {
			return nil
		}
		e := estimate{ms: finishOf(slots, svc, pos).Milliseconds()}
		lo, hi, _ := p.est.runs.spread()
		e.lo = min(finishOf(slots, lo, pos).Milliseconds(), e.ms)
		e.hi = max(finishOf(slots, hi, pos).Milliseconds(), e.ms)
		return &e
	}
	// nextFreeText is "next free in ~0.8 s" after sep, or "" when not known.
	nextFreeText := func(sep string) string {
		if !svcOK || nextFree == time.Duration(math.MaxInt64) {
			return ""
		}
		return fmt.Sprintf("%snext free in ~%.1f s", sep, nextFree.Seconds())
	}
	nextText := func() string {
		if t := nextFreeText(" ("); t != "" {
			return t + ")"
		}
		return ""
	}

	switch {
	case p.bootFailures > 0 && (booting > 0 || p.backoffT.armed()):
		return &store.Wait{Code: WaitBootFailed, Text: s.bootingMessage(p)}, nil
	case ready == 0 && booting == 0 && parked > 0:
		return &store.Wait{Code: WaitBooting, Text: "replica restoring from parking"}, nil
	case ready == 0 && booting > 0 && building == booting:
		return &store.Wait{Code: WaitBuilding, Text: fmt.Sprintf("%s (%.1f s so far)", backend.PhaseBuildingEnvironment, buildElapsed.Seconds())}, nil
	case ready == 0 && booting > 0:
		text := fmt.Sprintf("replica booting (%.1f s so far)", bootElapsed.Seconds())
		if bootOK {
			text = fmt.Sprintf("replica booting (%.1f s of a usual %.0f s)", bootElapsed.Seconds(), math.Max(boot.Seconds(), 1))
		}
		if f := (bootFailure{text: bootCheck}); bootCheck != "" && f.pending() == bootCheck {
			// The model's readiness check so far: a 404 or 501 says it may
			// never get ready (bootcheck.go stops it once that holds).
			text += "; last check: " + bootCheck
		}
		return &store.Wait{Code: WaitBooting, Text: text}, eta()
	}
	if q, ok := s.runQuota(p); ok {
		// Dispatch waits for one of the team's running calls to end.
		return &store.Wait{Code: WaitTeamQuota, Text: q}, eta(s.teamResiduals(p.cfg.TeamID, now)...)
	}
	if ready > 0 && busy < ready {
		return &store.Wait{Code: WaitNext, Text: "about to run"}, eta()
	}
	if ready == 0 && p.backoffT.armed() {
		in := p.backoffT.at.Sub(now)
		var extra []time.Duration
		if bootOK {
			extra = slices.Repeat([]time.Duration{in + boot}, conc)
		}
		return &store.Wait{Code: WaitRestarting, Text: fmt.Sprintf("replica restarting after a crash (next boot in %.1f s)", in.Seconds())}, eta(extra...)
	}
	if booting > 0 {
		// Busy, and more on the way: the nearer of the two frees it.
		text := fmt.Sprintf("%s%s; another booting (%.1f s so far)", busyText(ready), nextText(), bootElapsed.Seconds())
		if bootOK {
			text = fmt.Sprintf("%s%s; another booting (%.1f s of a usual %.0f s)", busyText(ready), nextText(), bootElapsed.Seconds(), math.Max(boot.Seconds(), 1))
		}
		return &store.Wait{Code: WaitReplicasBusy, Text: text}, eta()
	}
	live := p.live()
	switch {
	case live >= p.maxReplicas() && ready > 0:
		return &store.Wait{Code: WaitMaxReplicas, Text: fmt.Sprintf("maxReplicas %d reached (%s%s)", p.maxReplicas(), busyText(ready), nextFreeText(", "))}, eta()
	case live >= p.maxReplicas():
		return &store.Wait{Code: WaitMaxReplicas, Text: fmt.Sprintf("maxReplicas %d reached", p.maxReplicas())}, eta()
	}
	// What keeps another replica from booting; with replicas of its own,
	// the call also waits for them.
	busyNote := ""
	if ready > 0 {
		busyNote = fmt.Sprintf("%s%s; ", busyText(ready), nextText())
	}
	if q := s.bootQuota(p); q != "" {
		return &store.Wait{Code: WaitTeamQuota, Text: busyNote + q}, eta()
	}
	if w, in, ok := s.capacityWait(p, now); ok {
		var extra []time.Duration
		if in >= 0 && bootOK {
			extra = slices.Repeat([]time.Duration{in + boot}, conc)
		}
		w.Text = busyNote + w.Text
		if w.Named != "" {
			w.Named = busyNote + w.Named
		}
		return w, eta(extra...)
	}
	if ready > 0 {
		return &store.Wait{Code: WaitReplicasBusy, Text: busyText(ready) + nextText()}, eta()
	}
	// Nothing runs, boots or holds it back: the next pass boots a replica.
	var extra []time.Duration
	if bootOK {
		extra = slices.Repeat([]time.Duration{boot}, conc)
	}
	return &store.Wait{Code: WaitBooting, Text: "replica about to boot"}, eta(extra...)
}

// busyText says that a project's n ready replicas are all busy: "its
// replica busy", "all 2 replicas busy".
func busyText(n int) string {
	if n == 1 {
		return "its replica busy"
	}
	return fmt.Sprintf("all %d replicas busy", n)
}

// residual estimates how much is left of something that usually takes
// usual and has run for elapsed: what is left of the usual time, but never
// less than an eighth of it (it has already taken longer than usual: it
// ends soon, not now).
func residual(usual, elapsed time.Duration) time.Duration {
	return max(usual-elapsed, usual/8)
}

// finishOf is when the call pos places from the head of the queue finishes,
// from now, if slots free at the times given and every call takes svc: the
// calls ahead and this one go, in turn, to whichever slot frees first. The
// (pos+1)-th start is the smallest t at which the slots have started pos+1
// calls, found by bisection (the count only grows with t).
func finishOf(slots []time.Duration, svc time.Duration, pos int) time.Duration {
	if svc <= 0 {
		svc = time.Millisecond
	}
	started := func(t time.Duration) int {
		n := 0
		for _, f := range slots {
			if t >= f {
				n += int((t-f)/svc) + 1
			}
		}
		return n
	}
	lo, hi := slices.Min(slots), slices.Max(slots)+time.Duration(pos+1)*svc
	for hi-lo > time.Millisecond {
		mid := lo + (hi-lo)/2
		if started(mid) >= pos+1 {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi + svc
}

// runQuota says, when p's team runs as many calls as its runningCalls
// quota allows, "team T quota runningCalls N/N".
func (s *Scheduler) runQuota(p *project) (string, bool) {
	q := s.quotas[p.cfg.TeamID]
	if q.RunningCalls == 0 {
		return "", false
	}
	running := s.useOf(p.cfg.TeamID).running
	l := s.limitsOf(p.cfg.TeamID, q).running
	if l.allows(running, 1) {
		return "", false
	}
	return fmt.Sprintf("team %s quota runningCalls %d/%s", p.cfg.TeamID, running, l.text()), true
}

// bootQuota says, when p's team may not boot another replica of p, which
// quota holds it: "team T quota replicas 2/2".
func (s *Scheduler) bootQuota(p *project) string {
	q := s.quotas[p.cfg.TeamID]
	if s.bootBlocked(p) == "" {
		return ""
	}
	u := s.useOf(p.cfg.TeamID)
	l := s.limitsOf(p.cfg.TeamID, q)
	gpus := requestOf(p.cfg.Model).gpus
	switch {
	case !l.replicas.allows(u.replicas, 1):
		return fmt.Sprintf("team %s quota replicas %d/%s", p.cfg.TeamID, u.replicas, l.replicas.text())
	case gpus > 0:
		return fmt.Sprintf("team %s quota gpus %d/%s", p.cfg.TeamID, u.gpus, l.gpus.text())
	default:
		return fmt.Sprintf("team %s quota cpuSlots %d/%s", p.cfg.TeamID, u.cpuSlots, l.cpuSlots.text())
	}
}

// teamResiduals estimates when each running call of team ends, each by
// its own project's service time.
func (s *Scheduler) teamResiduals(team string, now time.Time) []time.Duration {
	var out []time.Duration
	for _, q := range s.order {
		if q.cfg.TeamID != team {
			continue
		}
		svc, ok := q.est.runs.mean()
		if !ok {
			continue
		}
		for _, r := range q.replicas {
			for cc := range r.calls {
				out = append(out, residual(svc, now.Sub(cc.c.Dispatched)))
			}
		}
	}
	return out
}

// capacityWait says why p gets no CPU slot or GPU for the replica it
// wants, when that is so: another project's idle replica holds it (and
// when its idle timeout frees it: in, else -1), one is being stopped for
// it, other projects' minimums hold all of it (held.go's heldBy, or every
// holder a minimum), or other projects' busy replicas do. No text names
// another project; held.go's Named does, for the callers who may see them.
func (s *Scheduler) capacityWait(p *project, now time.Time) (*store.Wait, time.Duration, bool) {
	if p.waiting == "" {
		return nil, 0, false
	}
	gpu := requestOf(p.cfg.Model).gpus > 0
	what := "CPU slot"
	if gpu {
		what = "GPU"
	}
	var idle *rep
	holders, minimums, own := 0, 0, 0
	stopping := false
	for _, q := range s.order {
		for _, r := range q.replicas {
			if (len(r.gpus) > 0) != gpu || (!gpu && !r.cpuSlot) {
				continue
			}
			if q == p {
				own++ // its own: busy, or it would take the call
				continue
			}
			holders++
			switch {
			case r.state == stateStopping:
				stopping = true
			case q.live() <= q.minReplicas():
				minimums++ // never stopped for another project
			case r.idle() && r.idleT.armed() && (idle == nil || r.idleT.at.Before(idle.idleT.at)):
				idle = r
			}
		}
	}
	switch {
	case stopping:
		return &store.Wait{Code: WaitFreeing, Text: what + " being freed: a replica of another project is stopping"}, 0, true
	case idle != nil:
		in := max(idle.idleT.at.Sub(now), 0)
		return &store.Wait{Code: WaitHeldByIdle, Text: fmt.Sprintf("%s held by an idle replica of another project (evictable in %.0f s)", what, math.Ceil(in.Seconds()))}, in, true
	case p.heldBy != nil:
		w := *p.heldBy
		return &w, -1, true
	case holders == 0 && own > 0 && gpu:
		return &store.Wait{Code: WaitCapacity, Text: "no GPU free for another replica: its own replicas hold them"}, -1, true
	case holders == 0 && own > 0:
		return &store.Wait{Code: WaitCapacity, Text: fmt.Sprintf("no CPU slot for another replica: its own replicas hold all %d cpuSlots", s.cpuSlots())}, -1, true
	case holders > 0 && minimums == holders:
		if gpu {
			return &store.Wait{Code: WaitHeldByMinimums, Text: "no GPU: other projects' minReplicas hold the GPUs it needs"}, -1, true
		}
		return &store.Wait{Code: WaitHeldByMinimums, Text: fmt.Sprintf("no CPU slot: other projects' minReplicas hold all %d cpuSlots", s.cpuSlots())}, -1, true
	case gpu && own > 0:
		return &store.Wait{Code: WaitCapacity, Text: "no GPU free: its own replicas and other projects' busy replicas hold them"}, -1, true
	case gpu:
		return &store.Wait{Code: WaitCapacity, Text: "no GPU free: other projects' busy replicas hold them"}, -1, true
	case own > 0:
		return &store.Wait{Code: WaitCapacity, Text: fmt.Sprintf("all %d CPU slots busy: %d with its own replicas, %d with other projects' calls", s.cpuSlots(), own, holders)}, -1, true
	}
	return &store.Wait{Code: WaitCapacity, Text: fmt.Sprintf("all %d CPU slots busy with other projects' calls", s.cpuSlots())}, -1, true
}
