package scheduler

import (
	"errors"
	"slices"
	"sort"
	"time"

	"inferd/store"
)

// project is the loop's state of one project: its settings, queue and
// replicas.
type project struct {
	id  string
	cfg store.Project
	// specGen counts model spec changes; replicas started from an older one
	// are drained.
	specGen  int
	queue    queue
	replicas []*rep // in start order
	next     int    // last replica number handed out
	running  int    // calls running on its replicas
	deleted  bool   // its replicas are stopping; it goes once they have
	touched  bool   // in the scheduling pass's touched list (narrow.go)
	// clustered: the node is one of a cluster's, and share its part of
	// the project's replicas (cluster.go: minReplicas, maxReplicas).
	clustered bool
	share     share
	// warmers wait for a replica to be ready (Warmup); while there are
	// any, p wants at least one replica.
	warmers []chan error

	bootFailures int           // consecutive failed boots
	lastBoot     bootFailure   // the last of them, for the calls that wait (bootfail.go)
	refusing     bool          // boots failed for good: new calls fail while the backoff runs
	backoff      time.Duration // the next restart wait; 0 = RestartBackoff
	backoffT     timer         // armed: no boots until it fires
	lastError    string
	oomKills     int      // replicas of it the kernel killed for its memoryMiB
	est          measured // its recent run and boot times, for the estimates (estimate.go)
	waiting      string   // why a wanted replica is not booting, for the status
	quotaWait    string   // why its team's quota holds it back this pass (tenancy.go), for the status
	// heldBy says why, with no replica of its own, it can get no CPU slot
	// or GPU while other projects' minimums hold them (held.go), for its
	// queued calls and the status, naming those projects only in its
	// Named (store.Wait); nil otherwise.
	heldBy *store.Wait

	// Batching (batch.go): batchT ends the wait for a batch to fill, which
	// began at waitSince; batches and batchedCalls count what was sent.
	batchT                timer
	waitSince             time.Time
	batches, batchedCalls int64

	// lastErrorAt and lastErrorReplica say when lastError happened and which
	// replica's log tells more ("" when no replica's does), for the status.
	lastErrorAt      time.Time
	lastErrorReplica string

	// parkOff says why p parks no more (parking.go), since specGen
	// parkOffGen; "" while it may.
	parkOff    string
	parkOffGen int
}

// concurrency, inferenceTimeout and bootTimeout read the project's settings
// with the store's defaults for a value a record lacks (store.ModelSpec's
// WithDefaults, and ConcurrencyOrDefault, which it uses, are their one
// source), never below what keeps the loop going.
func (p *project) concurrency() int { return max(1, p.cfg.Model.ConcurrencyOrDefault()) }

func (p *project) inferenceTimeout() int {
	if p.cfg.InferenceTimeout <= 0 {
		return store.DefaultInferenceTimeout
	}
	return p.cfg.InferenceTimeout
}

func (p *project) bootTimeout() int {
	if t := p.cfg.Model.WithDefaults().BootTimeout; t > 0 {
		return t
	}
	return store.DefaultBootTimeout
}

// live counts the replicas that serve or will serve the current spec: not
// stopping, not draining, not retiring (rollout.go).
func (p *project) live() int {
	n := 0
	for _, r := range p.replicas {
		if r.live() {
			n++
		}
	}
	return n
}

// want is the desired number of replicas: enough for the queued calls and
// those running on live replicas, within [min, max]. Queued low-priority
// calls do not count: they only use capacity nobody else waits for (see
// wantLow).
func (p *project) want() int {
	return p.wantFor(p.queue.len() - p.queue.lenLow())
}

// wantLow is want with the queued low-priority calls counted: what p may
// scale to while no other project waits for capacity.
func (p *project) wantLow() int { return p.wantFor(p.queue.len()) }

func (p *project) wantFor(queued int) int {
	load, retiring := queued, 0
	for _, r := range p.replicas {
		switch {
		case r.live():
			load += len(r.calls)
		case r.retiring():
			retiring++
		}
	}
	n := (load + p.callsPerReplica() - 1) / p.callsPerReplica()
	if len(p.warmers) > 0 {
		n = max(n, 1)
	}
	// A roll replaces every replica that serves the old spec (rollout.go).
	n = max(n, retiring)
	return min(max(n, p.minReplicas()), p.maxReplicas())
}

// pick returns the ready replica that should take the next call: the
// fullest one with room, so that calls pack and spare replicas go idle; a
// replica of the current spec before a retiring one (rollout.go), so that
// the old ones go idle and stop.
func (p *project) pick() *rep {
	var best *rep
	for _, r := range p.replicas {
		if r.state != stateReady || r.draining || r.slotsUsed() >= p.concurrency() || r.exited() {
			continue
		}
		if best == nil {
			best = r
			continue
		}
		cur, bestCur := r.gen == p.specGen, best.gen == p.specGen
		if cur && !bestCur || cur == bestCur && len(r.calls) > len(best.calls) {
			best = r
		}
	}
	return best
}

// booting reports whether a queued call waits for a boot: a replica is
// starting and none is ready.
func (p *project) booting() bool {
	boot := false
	for _, r := range p.replicas {
		switch {
		case r.state == stateReady && !r.draining:
			return false
		case r.state == stateBooting && !r.draining:
			boot = true
		}
	}
	return boot
}

// addProject makes cfg known to the loop, or revives a deleted project that
// is still stopping its replicas.
func (s *Scheduler) addProject(cfg store.Project) *project {
	if p := s.projects[cfg.ID]; p != nil {
		if p.deleted {
			p.deleted = false
			p.cfg = cfg
			p.specGen++ // whatever still runs belongs to the deleted one
			p.resetFailures()
			p.lastError, p.lastErrorReplica, p.lastErrorAt = "", "", time.Time{}
			p.share = s.shareOf(p.id)
		}
		return p
	}
	p := &project{id: cfg.ID, cfg: cfg, clustered: s.cfg.Share != nil, share: s.shareOf(cfg.ID)}
	p.queue.aging = s.cfg.PriorityAging
	s.projects[p.id] = p
	i := sort.Search(len(s.order), func(i int) bool { return s.order[i].id >= p.id })
	s.order = slices.Insert(s.order, i, p)
	return p
}

// removeProject forgets a deleted project once its replicas have exited.
func (s *Scheduler) removeProject(p *project) {
	delete(s.projects, p.id)
	s.order = slices.DeleteFunc(s.order, func(q *project) bool { return q == p })
}

func (p *project) resetFailures() {
	p.bootFailures = 0
	p.lastBoot, p.refusing = bootFailure{}, false
	p.backoff = 0
	p.backoffT.stop()
}

// reload re-reads project id off the loop. Reads of one project never
// overlap, and a change during a read causes one more, so the last read
// always follows the last change.
func (s *Scheduler) reload(id string) {
	if _, busy := s.loading[id]; busy {
		s.loading[id] = true
		return
	}
	s.loading[id] = false
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		p, err := s.st.GetProject(id)
		s.in.post(evProjectLoaded{id: id, p: p, err: err})
	}()
}

func (s *Scheduler) onProjectLoaded(ev evProjectLoaded) {
	again := s.loading[ev.id]
	delete(s.loading, ev.id)
	if again {
		s.reload(ev.id)
		return
	}
	switch {
	case errors.Is(ev.err, store.ErrNotFound):
		if p := s.projects[ev.id]; p != nil && !p.deleted {
			s.deleteProject(p)
		}
	case ev.err != nil:
		s.log.Error().Err(ev.err).Str("project", ev.id).Msg("re-reading a changed project failed; keeping its old settings")
	default:
		s.applyProject(ev.p)
	}
}

// applyProject reconciles a project with its new settings: a changed model
// spec drains the old replicas; a lower min or max stops surplus idle
// replicas now; a higher min boots in the scheduling pass that follows; a new
// idleTimeout re-times the replicas already idle; a new inferenceTimeout
// applies to the next dispatches.
func (s *Scheduler) applyProject(cfg store.Project) {
	p := s.projects[cfg.ID]
	if p == nil || p.deleted {
		p = s.addProject(cfg)
		s.checkGPUs(p)
		return
	}
	old := p.cfg
	oldMin, oldMax := p.minReplicas(), p.maxReplicas()
	p.cfg = cfg
	p.share = s.shareOf(cfg.ID)
	if old.Model.RestartNeeded(cfg.Model) {
		p.resetFailures()
		s.roll(p)
		s.log.Info().Str("project", p.id).Int("retiring", p.retiringCount()).
			Msg("model spec changed; replacing the replicas one by one (rollout.go)")
	}
	if p.minReplicas() < oldMin || p.maxReplicas() < oldMax {
		s.trimIdle(p)
	}
	if cfg.IdleTimeout != old.IdleTimeout {
		// Armed timers hold the old length: the pass that follows re-arms
		// them from each replica's idleSince.
		for _, r := range p.replicas {
			r.idleT.stop()
		}
	}
	s.checkGPUs(p)
}

// deleteProject fails the calls of a deleted project and stops its replicas.
func (s *Scheduler) deleteProject(p *project) {
	p.deleted = true
	p.waiting = ""
	p.warmed(errors.New("project deleted"))
	p.backoffT.stop()
	s.failQueued(p, failed(store.FailInferd, msgProjectDeleted))
	for _, r := range p.replicas {
		for _, c := range r.callList() {
			s.detach(c)
			s.finish(c, nil, failed(store.FailInferd, msgProjectDeleted))
		}
		s.stop(r)
	}
	s.log.Info().Str("project", p.id).Msg("project deleted; stopping its replicas")
	if len(p.replicas) == 0 {
		s.removeProject(p)
	}
}

// checkGPUs fails the queued calls of a project that needs more GPUs per
// replica than the machine has: they could never run.
func (s *Scheduler) checkGPUs(p *project) {
	err := fitsMachine(s.devices(), requestOf(p.cfg.Model))
	if err == nil {
		return
	}
	p.lastError, p.lastErrorReplica, p.lastErrorAt = err.Error(), "", s.clk.Now()
	if p.queue.len() > 0 {
		s.failQueued(p, failed(store.FailNotStarted, msgNeedsGPUs(err)))
	}
}

// trimIdle stops idle replicas, least recently used first, while the
// project has more than it wants.
func (s *Scheduler) trimIdle(p *project) {
	idle := s.idleReplicas(p)
	live := p.live()
	for _, r := range idle {
		if live <= p.want() {
			return
		}
		s.stop(r)
		live--
	}
}

// idleReplicas returns p's live idle replicas, least recently used first. The
// slice is scratch space, valid until the next call.
func (s *Scheduler) idleReplicas(p *project) []*rep {
	idle := s.scratch[:0]
	for _, r := range p.replicas {
		if r.live() && r.idle() {
			idle = append(idle, r)
		}
	}
	slices.SortStableFunc(idle, func(a, b *rep) int { return a.idleSince.Compare(b.idleSince) })
	s.scratch = idle
	return idle
}

func seconds(n int) time.Duration { return time.Duration(n) * time.Second }
