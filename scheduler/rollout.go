package scheduler

import "slices"

// Rolling onto a new spec (docs/operations.md "Rolling a project onto new
// code"): a change to how a project's replicas are started (a new command,
// env, revision, or `inferd project restart`) replaces them one by one, so
// that no call waits for a cold boot that a running replica could have
// served:
//
//   - A ready replica of the old spec keeps taking calls: it is retiring.
//     It no longer counts as live (live() is the current spec's replicas), so
//     scale-up boots replicas of the new spec, at least as many as there are
//     retiring ones (wantFor), beside them: a roll may hold one replica more
//     than maxReplicas for a while.
//   - Each replica of the new spec that gets ready retires one old one: an
//     idle one stops at once, a busy one drains (takes no new call and stops
//     once its calls end).
//   - Where the box has no room for a new replica beside the old ones (CPU
//     slots, GPUs or the team's quota), one old replica gives way, idle first,
//     while no new one is booting; its calls queue until the new one is ready.
//   - Old replicas that are booting, parked, parking or restoring stop (or
//     drain) at once: they serve nothing now.
//   - Old replicas that no new one will replace (the spec change lowered
//     maxReplicas, say) retire at once (trimRetiring).
//   - A new spec that fails to boot leaves the retiring replicas serving the
//     old one; its queued calls are not failed for it (bootFailed) while they
//     serve, and the project's status says why.

// retiring reports whether r serves an older spec of its project until a
// replica of the current one replaces it.
func (r *rep) retiring() bool {
	return r.gen != r.p.specGen && r.state != stateStopping && !r.draining
}

// retiringCount counts p's retiring replicas.
func (p *project) retiringCount() int {
	n := 0
	for _, r := range p.replicas {
		if r.retiring() {
			n++
		}
	}
	return n
}

// roll starts p's roll onto a new spec: the old replicas that serve keep
// serving (they are retiring from now on), the others stop or drain.
func (s *Scheduler) roll(p *project) {
	p.specGen++
	for _, r := range p.replicas {
		if r.state == stateStopping || r.draining {
			continue
		}
		if r.state == stateReady && !r.exited() {
			continue // retiring: it serves until a new replica replaces it
		}
		r.draining = true
		if r.state == stateBooting || len(r.calls) == 0 {
			s.stop(r)
		}
	}
}

// retireOne ends the service of one of p's retiring replicas, the least
// busy one: an idle one stops, a busy one drains. It reports whether there
// was one.
func (s *Scheduler) retireOne(p *project, why string) bool {
	var old *rep
	for _, r := range p.replicas {
		if !r.retiring() {
			continue
		}
		if old == nil || len(r.calls) < len(old.calls) ||
			(len(r.calls) == len(old.calls) && r.idleSince.Before(old.idleSince)) {
			old = r
		}
	}
	if old == nil {
		return false
	}
	s.log.Info().Str("project", p.id).Str("replica", old.id).Int("calls", len(old.calls)).Msg(why)
	old.draining = true
	if old.idle() {
		s.stop(old)
	}
	return true
}

// trimRetiring retires the old replicas that no replica of the new spec
// will come to replace: each one booting, and each one p still wants to
// boot, retires one when it gets ready (onReady); the rest go now. So a
// spec change that also lowers maxReplicas, or a cluster node whose share
// of the project is gone, does not keep old replicas serving for good.
func (s *Scheduler) trimRetiring(p *project) {
	retiring := p.retiringCount()
	if retiring == 0 {
		return
	}
	booting := 0
	for _, r := range p.replicas {
		if r.live() && r.state == stateBooting {
			booting++
		}
	}
	for excess := retiring - booting - max(p.want()-p.live(), 0); excess > 0; excess-- {
		if !s.retireOne(p, "no replica of the new spec is coming to replace it; retiring an old one") {
			return
		}
	}
}

// yieldOld lets one retiring replica of p give way when p cannot boot a
// replica of its new spec beside them, unless one is booting already (its
// readiness retires one).
func (s *Scheduler) yieldOld(p *project) {
	if slices.ContainsFunc(p.replicas, func(r *rep) bool { return r.live() && r.state == stateBooting }) {
		return
	}
	s.retireOne(p, "no room for a replica of the new spec beside the old ones; stopping an old one first")
}
