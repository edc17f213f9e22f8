package scheduler

import (
	"errors"
	"fmt"
	"time"

	"inferd/store"
)

// Cluster mode (docs/cluster.md): a node runs the calls it started or was
// handed by the leader (Adopt), within its share of each project's
// replicas (Config.Share), and drops every live call without a write when
// its lease lapses (Abandon), since the leader may hand them to others. A
// write the store refuses because the call is no longer this node's
// (store.ErrFenced) makes the loop forget the call the same way.

// msgDiscarded is logged when a call's write is refused because the call
// was handed to another node.
const msgDiscarded = "result discarded: call was handed to another node"

// errLeaseLost is a start's error for a call this node dropped, unstored,
// when it lost its cluster lease: nobody was given its ID, so the client
// starts it again (through any node). Its text is the client message
// without "error: ".
var errLeaseLost = fmt.Errorf("%w; retry", store.ErrUnavailable)

// Adopt takes call c, stored and not final, that the cluster's leader
// handed to this node, into its project's queue, as a restart recovers a
// queued call of its own (a running one is run again when its project's
// retries allow, else it fails as interrupted). A call already live here,
// or final, is ignored. It never blocks on the loop; it reads the
// project from the store when the loop does not know it yet.
func (s *Scheduler) Adopt(c store.Call) {
	if c.State.Done() {
		return
	}
	ev := evAdopt{c: c}
	p, err := s.st.GetProject(c.ProjectID)
	switch {
	case err == nil:
		ev.p = &p
	case !errors.Is(err, store.ErrNotFound):
		// The loop's copy will do; without one the call fails as its
		// project's would (see onAdopt).
		s.log.Warn().Err(err).Str("call", c.ID).Str("project", c.ProjectID).Msg("adopting a call: reading its project failed")
	}
	s.in.post(ev) // after shutdown the call stays in the store, pending here: a restart recovers it
}

// evAdopt: Adopt was called; p is the project as read then (nil: not found
// or unreadable).
type evAdopt struct {
	c store.Call
	p *store.Project
}

func (evAdopt) isEvent() {}

func (s *Scheduler) onAdopt(ev evAdopt) {
	c := ev.c
	if _, live := s.calls[c.ID]; live {
		return
	}
	p := s.projects[c.ProjectID]
	if ev.p != nil && (p == nil || p.deleted) {
		p = s.addProject(*ev.p)
	}
	if p != nil && p.deleted {
		p = nil
	}
	s.log.Info().Str("call", c.ID).Str("project", c.ProjectID).Str("state", string(c.State)).Msg("call handed to this node")
	if w, ok := s.recoverCall(c, p, s.clk.Now()); ok {
		s.st.SaveCallAsync(w, func(err error) {
			switch {
			case errors.Is(err, store.ErrFenced):
				s.log.Warn().Str("call", w.ID).Msg(msgDiscarded)
			case err != nil:
				s.log.Error().Err(err).Str("call", w.ID).Msg("saving an adopted call failed")
			}
		})
	}
	if p != nil {
		s.checkGPUs(p)
	}
}

// Abandon drops every live call without writing anything: this node's
// cluster lease lapsed (it was cut off from etcd), so the leader may hand
// its calls to other nodes, and the store refuses its writes of them
// (store.ErrFenced). Running calls' model requests are aborted (their
// replicas are replaced if not free within Config.AbortGrace, as for a
// cancel); waiters are answered with the call as it stands, so the client
// checks it elsewhere, and a synchronous start whose call was never stored
// fails with "cluster unavailable; retry". Calls whose final write is in
// flight are left to it: committed, the result stands; refused, the call is
// forgotten the same way. Failures whose final write did not land (kept in
// memory to answer for them) are forgotten too: the store answers for
// them. Replicas are kept. Abandon returns once done, at
// once when the scheduler is not running.
func (s *Scheduler) Abandon() {
	s.control(func() {
		n := 0
		for _, c := range s.calls {
			if s.abandon(c) {
				n++
			}
		}
		// Failures whose final write did not land are pending in the
		// store too, under the lapsed lease: the leader hands them on, so
		// the store answers for them now, not this node's memory.
		n += len(s.resave.take())
		s.failures = newRecentFailures(maxRecentFailures)
		if n > 0 {
			s.log.Warn().Int("calls", n).Msg("cluster lease lapsed: dropped the live calls without writing them; the leader hands them on")
		}
	})
}

// abandon drops live call c without a write and wakes its waiters with it
// as it stands; it reports whether it did (a call whose final write is in
// flight is left to it).
func (s *Scheduler) abandon(c *call) bool {
	if c.finished() {
		return false
	}
	v := s.view(c)
	switch c.state {
	case callQueued, callSaving:
		c.p.queue.remove(c)
	case callRunning:
		s.abortRun(c) // as a cancel does
	}
	c.expiry.stop()
	s.forget(c, v)
	return true
}

// forget ends live call c here as abandoned, without a write: its waiters
// read v, the call as it stood.
func (s *Scheduler) forget(c *call, v store.Call) {
	if s.calls[c.c.ID] == c {
		delete(s.calls, c.c.ID)
	}
	s.unindex(c)
	c.result = v
	s.move(c, callAbandoned)
	close(c.done)
}

// evFenced: a write of live call c (not its final one) was refused: the
// call was handed to another node.
type evFenced struct{ c *call }

func (evFenced) isEvent() {}

// onFenced forgets c, unless it has ended meanwhile; a call whose final
// write is in flight hears of it through that write (discarded).
func (s *Scheduler) onFenced(c *call) {
	if s.calls[c.c.ID] != c || c.finished() {
		return
	}
	s.log.Warn().Str("call", c.c.ID).Str("project", c.p.id).Msg(msgDiscarded)
	s.abandon(c)
}

// discarded forgets c, whose final write the store refused because the
// call was handed to another node: its outcome here is discarded, and its
// waiters read the call as it stood before it (the other node's result
// is the one that counts). onFinal has taken it off the live calls.
func (s *Scheduler) discarded(c *call, err error) {
	s.log.Warn().Err(err).Str("call", c.c.ID).Str("project", c.p.id).Msg(msgDiscarded)
	s.forget(c, c.c)
}

// recoverCall takes stored pending call c of project p (nil: gone) back
// into the loop, as at start-up: queued, it is queued again; running, it
// is queued again under its ID when its project's retries allow, else it
// fails as interrupted; queued with its project gone, it fails. It returns
// the write the change needs, if any (ok false: none).
func (s *Scheduler) recoverCall(c store.Call, p *project, now time.Time) (write store.Call, ok bool) {
	if c.State == store.CallRunning && p != nil && p.mayRetry(c.Attempt) {
		// Interrupted with attempts left: run it again under its ID.
		// Its queue deadline is behind it: it was dispatched in time.
		c.State, c.ReplicaID = store.CallQueued, ""
		c.Dispatched, c.QueueMs, c.BootMs = time.Time{}, 0, 0
		c.QueueTimeout = 0
		s.cfg.Observer.CallRetried(p.id)
		write, ok = c, true
	}
	switch {
	case c.State == store.CallQueued && p != nil:
		cl := &call{c: c, state: callQueued, done: make(chan struct{}), p: p, bytes: c.InputBytes}
		s.calls[c.ID] = cl
		s.index(cl)
		p.queue.push(cl)
		s.armExpiry(cl)
		return write, ok
	case c.State == store.CallQueued:
		c.State, c.Message, c.Finished = store.CallFailed, msgProjectDeleted, now
		c.Failure = &store.Failure{Kind: store.FailInferd}
	default:
		c.State, c.Message, c.Finished = store.CallFailed, msgInterrupted, now
		c.Failure = &store.Failure{Kind: store.FailInterrupted}
	}
	return c, true
}

// Share is this node's part of a project's replicas in cluster mode (see
// Config.Share), kept by the loop per project and read again whenever the
// project changes (ProjectChanged).
type share struct {
	set      bool // Config.Share answered ok: the node is placed
	min, max int
}

// shareOf asks Config.Share for project id's bounds on this node.
func (s *Scheduler) shareOf(id string) share {
	if s.cfg.Share == nil {
		return share{}
	}
	lo, hi, ok := s.cfg.Share(id)
	return share{set: ok, min: max(lo, 0), max: max(hi, 0)}
}

// maxReplicas is the most replicas of p this node runs now: the project's
// maxReplicas on a single box; in cluster mode the node's share of it. A
// project not placed on this node (no share, or one of 0) runs no replica
// here, except one while calls of it are here (started before the project
// was placed, or left by a placement that moved: a call is never
// stranded) or while that replica lives: it then goes by its idle timeout,
// as any replica above what is wanted, not at once, so a project waiting
// for its first placement does not boot once per call. A placement that
// moves away stops idle replicas at once (applyProject: the bound drops).
func (p *project) maxReplicas() int {
	if !p.clustered {
		return p.cfg.MaxReplicas
	}
	n := min(p.share.max, p.cfg.MaxReplicas)
	if !p.share.set {
		n = 0
	}
	if n == 0 && (p.queue.len() > 0 || p.running > 0 || len(p.warmers) > 0 || p.live() > 0) {
		n = 1
	}
	return n
}

// minReplicas is the fewest replicas of p this node keeps: the project's
// minReplicas on a single box, the node's share of it in cluster mode.
func (p *project) minReplicas() int {
	if !p.clustered {
		return p.cfg.MinReplicas
	}
	if !p.share.set {
		return 0
	}
	return min(p.share.min, p.cfg.MinReplicas, p.maxReplicas())
}
