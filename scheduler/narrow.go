package scheduler

// The scheduling pass runs after every event and, in full, visits every
// project: dispatch, idle and parking timers, then scale-up across them all.
// The events of a call's plain way through (its admission, its first write
// committing, its end on its replica) change one project only, so while
// nothing waits (no project for capacity or for its team's quota) the pass
// after them visits only the projects they touched. A call then costs the loop the same whether the box has one
// project or hundreds (BenchmarkDispatchCycleAmongProjects).
//
// The narrow pass is the full pass's first two steps (dispatch; idle and
// parking timers) for the touched projects, and gives way to the full pass
// whenever what it did could matter to another project: a touched project
// wants more replicas than it has (scale-up decides who gets them), or its
// team's quota holds it back. What the narrow pass may do to a replica
// frees no capacity: a stopped replica's slot and GPUs are freed when it
// exits, an event that widens the pass. Both passes are idempotent, so the
// full one running after a narrow one acts as a second pass would. Every
// other event, and every control (cancel, a priority change, a drain, a
// project or team change), widens the pass to all projects.

// passScope is what the next scheduling pass must visit.
type passScope struct {
	touched []*project
	wide    bool // visit every project
	// calm says that the last full pass left no project waiting: for
	// capacity (nor, then, for other projects' minimums or the GPU
	// inventory poll, which only a waiting project has), or for its team's
	// quota.
	calm bool
}

// touch marks p as changed by the event in hand.
func (ps *passScope) touch(p *project) {
	if !p.touched {
		p.touched = true
		ps.touched = append(ps.touched, p)
	}
}

// widen makes the next pass a full one.
func (ps *passScope) widen() { ps.wide = true }

// reset forgets the events of the pass that has just run.
func (ps *passScope) reset() {
	for _, p := range ps.touched {
		p.touched = false
	}
	clear(ps.touched)
	ps.touched = ps.touched[:0]
	ps.wide = false
}

// narrowPass runs the pass over the touched projects alone and reports
// true, or reports false when the full pass must run instead (see above).
func (s *Scheduler) narrowPass() bool {
	ps := &s.pass
	if ps.wide || !ps.calm {
		return false
	}
	for _, p := range ps.touched {
		s.dispatch(p) // quotaWait is "" everywhere: the pass is calm
	}
	for _, p := range ps.touched {
		s.tidy(p)
		s.tidyParking(p)
	}
	for _, p := range ps.touched {
		if p.quotaWait != "" || s.wantsReplicas(p) {
			return false
		}
	}
	return true
}

// wantsReplicas reports whether scale-up would look at p: it wants more
// replicas than it has, for its calls or for its queued low-priority ones.
func (s *Scheduler) wantsReplicas(p *project) bool {
	live := p.live()
	return p.want() > live || (p.queue.lenLow() > 0 && p.wantLow() > live)
}

// settled reports whether the full pass that has just run left nothing
// waiting (passScope.calm).
func (s *Scheduler) settled() bool {
	for _, p := range s.order {
		if p.waiting != "" || p.quotaWait != "" {
			return false
		}
	}
	return true
}
