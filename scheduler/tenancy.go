package scheduler

import (
	"errors"
	"fmt"
	"slices"

	"inferd/store"
)

// Tenancy (DESIGN.md "Tenancy"): each team's quota bounds what its projects
// hold (replicas, GPUs, CPU slots), run (calls at once) and queue (calls
// and their input bytes); a zero field is unlimited, so a box without
// quotas schedules as if it had one team. When the box is full, a team
// below its fair share may have an idle replica of a team above its share
// stopped (see mayEvictFor); within a team the LRU rule of evict stands.

// ErrTeamQuota is wrapped by Submit's error when the project's team already
// queues as many calls, or input bytes, as its quota allows.
var ErrTeamQuota = errors.New("team quota reached")

// teamQuotaError names the quota a start would exceed, e.g. "team acme is at
// its queuedCalls quota (5000); retry later".
type teamQuotaError struct {
	team, quota string
	max         int64
}

func (e *teamQuotaError) Error() string {
	return fmt.Sprintf("team %s is at its %s quota (%d); retry later", e.team, e.quota, e.max)
}

func (e *teamQuotaError) Unwrap() error { return ErrTeamQuota }

// TeamStatus is one team's use of the box against its quota.
type TeamStatus struct {
	ID    string      `json:"id"`
	Quota store.Quota `json:"quota"` // zero fields are unlimited
	// Share and Want are the cluster's (Config.TeamShare): this node's
	// share of the team's quotas in force, and what the team's projects
	// here would hold if their shares allowed (running calls: those
	// running and queued; replicas, GPUs, CPU slots: what the projects
	// want or run, whichever is more). Nil on a single box.
	Share        *store.Quota `json:"share,omitempty"`
	ShareRev     int64        `json:"shareRev,omitempty"` // the revision of the leader's record Share came from
	Want         *store.Quota `json:"want,omitempty"`
	Replicas     int          `json:"replicas"`
	GPUs         int          `json:"gpus"`
	CPUSlots     int          `json:"cpuSlots"`
	RunningCalls int          `json:"runningCalls"`
	QueuedCalls  int          `json:"queuedCalls"`
	QueuedBytes  int64        `json:"queuedBytes"`
}

// teamUse is what a team holds now: every replica that has not exited
// (stopping ones still hold their GPU or CPU slot), its running calls, and
// its calls not yet dispatched.
type teamUse struct {
	replicas, gpus, cpuSlots, running, queued int
	queuedBytes                               int64
}

// useOf adds up team's use. It walks the team's projects only, never the
// calls: a team with a quota has it asked on every admission and dispatch,
// and its queues may hold thousands. Their queues count their calls (queued
// and saving calls are exactly those in a queue: lifecycle.go) and the
// calls' input bytes (fifo.bytes).
func (s *Scheduler) useOf(team string) teamUse {
	var u teamUse
	for _, p := range s.order {
		if p.cfg.TeamID != team {
			continue
		}
		u.running += p.running
		u.queued += p.queue.len()
		u.queuedBytes += p.queue.bytes() // inputs of durable queued calls are not in memory
		for _, r := range p.replicas {
			u.replicas++
			u.gpus += len(r.gpus)
			if r.cpuSlot {
				u.cpuSlots++
			}
		}
	}
	return u
}

// admitTeam refuses a call of p, with inputs bytes of input, when p's team
// queues as many calls or bytes as its quota allows. Beside admitBytes
// (budget.go), the project's cap.
func (s *Scheduler) admitTeam(p *project, inputs int64) error {
	team := p.cfg.TeamID
	q := s.quotas[team]
	if q.QueuedCalls == 0 && q.QueuedBytes == 0 {
		return nil
	}
	u := s.useOf(team)
	switch {
	case q.QueuedCalls > 0 && u.queued >= q.QueuedCalls:
		return &teamQuotaError{team: team, quota: "queuedCalls", max: int64(q.QueuedCalls)}
	case q.QueuedBytes > 0 && u.queuedBytes+inputs > q.QueuedBytes:
		return &teamQuotaError{team: team, quota: "queuedBytes", max: q.QueuedBytes}
	}
	return nil
}

// limit is one field of a team's limits in force: none (on false), or at
// most n, which may be 0 (a node of a cluster whose share of the quota is
// none).
type limit struct {
	n, quota int  // the limit, and the team's quota it comes from
	on       bool // the quota bounds this field
	shared   bool // n is this node's share of the cluster's quota
}

// allows reports whether used plus more stays within the limit.
func (l limit) allows(used, more int) bool { return !l.on || used+more <= l.n }

// text is the limit as a waiting reason shows it: the quota, and in a
// cluster this node's share of it.
func (l limit) text() string {
	if l.shared {
		return fmt.Sprintf("%d; this node's share %d", l.quota, l.n)
	}
	return fmt.Sprint(l.n)
}

// teamLimits are the limits in force for a team's running calls,
// replicas, GPUs and CPU slots: its quota, and in a cluster the smaller
// of the quota and this node's share of it (Config.TeamShare).
type teamLimits struct{ running, replicas, gpus, cpuSlots limit }

// limitsOf returns team's limits in force; q is its quota.
func (s *Scheduler) limitsOf(team string, q store.Quota) teamLimits {
	var share store.Quota
	shared := s.cfg.TeamShare != nil
	if shared {
		share, _ = s.cfg.TeamShare(team)
	}
	field := func(full, part int) limit {
		switch {
		case full == 0:
			return limit{}
		case shared:
			return limit{n: min(full, part), quota: full, on: true, shared: true}
		}
		return limit{n: full, quota: full, on: true}
	}
	return teamLimits{running: field(q.RunningCalls, share.RunningCalls), replicas: field(q.Replicas, share.Replicas),
		gpus: field(q.GPUs, share.GPUs), cpuSlots: field(q.CPUSlots, share.CPUSlots)}
}

// bootBlocked says why p's team may not boot another replica of p ("" when
// it may): the replica would take the team beyond its replicas, GPUs or CPU
// slots quota. The text is the project's waiting reason on the status page.
func (s *Scheduler) bootBlocked(p *project) string {
	team := p.cfg.TeamID
	q := s.quotas[team]
	if q.Replicas == 0 && q.GPUs == 0 && q.CPUSlots == 0 {
		return ""
	}
	l := s.limitsOf(team, q)
	u := s.useOf(team)
	gpus := requestOf(p.cfg.Model).gpus
	switch {
	case !l.replicas.allows(u.replicas, 1):
		return fmt.Sprintf("waiting: team %s is at its replicas quota (%s)", team, l.replicas.text())
	case gpus > 0 && !l.gpus.allows(u.gpus, gpus):
		return fmt.Sprintf("waiting: team %s is at its gpus quota (%s)", team, l.gpus.text())
	case gpus == 0 && !l.cpuSlots.allows(u.cpuSlots, 1):
		return fmt.Sprintf("waiting: team %s is at its cpuSlots quota (%s)", team, l.cpuSlots.text())
	}
	return ""
}

// runBlocked says why p may not start another call now ("" when it may):
// its team runs as many calls as its runningCalls quota allows.
func (s *Scheduler) runBlocked(p *project) string {
	team := p.cfg.TeamID
	q := s.quotas[team]
	if q.RunningCalls == 0 {
		return ""
	}
	l := s.limitsOf(team, q).running
	if l.allows(s.useOf(team).running, 1) {
		return ""
	}
	return fmt.Sprintf("waiting: team %s is at its runningCalls quota (%s)", team, l.text())
}

// TeamShareChanged tells the scheduler that this node's share of team
// id's quotas changed (cluster mode): a larger one may let waiting calls
// run or replicas boot now. It never blocks.
func (s *Scheduler) TeamShareChanged(id string) { s.in.post(evTeamShare{id: id}) }

// evTeamShare: TeamShareChanged was called.
type evTeamShare struct{ id string }

func (evTeamShare) isEvent() {}

// mayEvictFor reports whether an idle replica of victim may be stopped to
// make room for waiting: always within a team (evict's LRU rule), and
// across teams only when waiting's team is below its fair share of the
// resource (GPUs or CPU slots) and victim's team above it. A team's fair
// share is the resource divided evenly among the teams that hold it or
// wait for it.
func (s *Scheduler) mayEvictFor(waiting, victim *project, gpus bool) bool {
	if waiting.cfg.TeamID == victim.cfg.TeamID {
		return true
	}
	capacity := s.cpuSlots()
	if gpus {
		capacity = 0
		for _, d := range s.devices() {
			if d.Healthy() {
				capacity++
			}
		}
	}
	held := map[string]int{}
	var teams []string
	for _, p := range s.order {
		if (requestOf(p.cfg.Model).gpus > 0) != gpus {
			continue
		}
		t := p.cfg.TeamID
		for _, r := range p.replicas {
			if r.live() {
				held[t] += max(len(r.gpus), 1)
			}
		}
		if (held[t] > 0 || p.queue.len() > 0) && !slices.Contains(teams, t) {
			teams = append(teams, t)
		}
	}
	if len(teams) == 0 {
		return false
	}
	// Compared as held·teams against capacity, so that no share is rounded.
	share := func(t string) int { return held[t] * len(teams) }
	return share(waiting.cfg.TeamID) < capacity && share(victim.cfg.TeamID) > capacity
}

// teamStatus is each team's use against its quota, for the status page:
// the teams with a quota or a project, sorted by id.
func (s *Scheduler) teamStatus() []TeamStatus {
	var ids []string
	for id := range s.quotas {
		ids = append(ids, id)
	}
	for _, p := range s.order {
		if !slices.Contains(ids, p.cfg.TeamID) {
			ids = append(ids, p.cfg.TeamID)
		}
	}
	slices.Sort(ids)
	out := make([]TeamStatus, 0, len(ids))
	for _, id := range ids {
		u := s.useOf(id)
		st := TeamStatus{ID: id, Quota: s.quotas[id], Replicas: u.replicas, GPUs: u.gpus, CPUSlots: u.cpuSlots,
			RunningCalls: u.running, QueuedCalls: u.queued, QueuedBytes: u.queuedBytes}
		if s.cfg.TeamShare != nil {
			share, rev := s.cfg.TeamShare(id)
			want := s.wantOf(id, u)
			st.Share, st.ShareRev, st.Want = &share, rev, &want
		}
		out = append(out, st)
	}
	return out
}

// wantOf is what team's projects here would hold if their shares of the
// team's quotas allowed (TeamStatus.Want): u is the team's use.
func (s *Scheduler) wantOf(team string, u teamUse) store.Quota {
	w := store.Quota{RunningCalls: u.running + u.queued}
	for _, p := range s.order {
		if p.cfg.TeamID != team {
			continue
		}
		n := max(p.want(), p.live())
		w.Replicas += n
		if g := requestOf(p.cfg.Model).gpus; g > 0 {
			w.GPUs += n * g
		} else {
			w.CPUSlots += n
		}
	}
	return w
}

// TeamChanged tells the scheduler that team id's quota changed. It never
// blocks: the scheduler re-reads the team and schedules by the new quota.
func (s *Scheduler) TeamChanged(id string) { s.in.post(evTeamChanged{id: id}) }

// evTeamChanged: TeamChanged was called. evTeamLoaded: the team was read.
type evTeamChanged struct{ id string }
type evTeamLoaded struct {
	id  string
	t   store.Team
	err error
}

func (evTeamChanged) isEvent() {}
func (evTeamLoaded) isEvent()  {}

// reloadTeam reads team id off the loop, like reload does for projects:
// one read per team at a time, and another after it if the team changed
// meanwhile, so an older read never lands after a newer one.
func (s *Scheduler) reloadTeam(id string) {
	if _, busy := s.teamLoading[id]; busy {
		s.teamLoading[id] = true
		return
	}
	s.teamLoading[id] = false
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		t, err := s.st.GetTeam(id)
		s.in.post(evTeamLoaded{id: id, t: t, err: err})
	}()
}

func (s *Scheduler) onTeamLoaded(ev evTeamLoaded) {
	again := s.teamLoading[ev.id]
	delete(s.teamLoading, ev.id)
	switch {
	case again:
		s.reloadTeam(ev.id)
		return
	case errors.Is(ev.err, store.ErrNotFound):
		delete(s.quotas, ev.id)
		return
	case ev.err != nil:
		s.log.Error().Err(ev.err).Msg("re-reading a changed team failed; keeping its old quota")
		return
	}
	s.quotas[ev.t.ID] = ev.t.Quota
}
