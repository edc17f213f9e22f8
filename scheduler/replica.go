package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// replicaState is where a replica is in its life. Busy (ReplicaBusy) is not
// a state: it is a ready replica with calls in flight.
type replicaState int

const (
	stateBooting  replicaState = iota // launched or launching, not ready yet
	stateReady                        // takes calls
	stateStopping                     // Stop requested; gone once its process has exited
)

// rep is the loop's state of one model server process.
type rep struct {
	id  string
	p   *project
	gen int // the project's specGen it was started from

	inst  backend.Instance // nil until Launch has returned
	info  backend.Info     // the backend's description, once launched
	state replicaState
	// draining: started from an older spec; takes no new calls and is
	// stopped once idle.
	draining bool

	gpus      []string // GPU UUIDs it holds
	gpuMemMiB uint64   // per GPU; 0 = the whole GPUs
	cpuSlot   bool     // it holds one of the CPU slots

	started   time.Time
	readyAt   time.Time
	calls     map[*call]struct{} // running on it
	idleSince time.Time          // last time it had no calls
	idleT     timer              // idle timeout
	boot      timer              // boot timeout
	// aborting counts the cancelled calls whose request to the model has
	// not returned yet: each holds its room on the replica until it does,
	// and abortT stops the replica if one has not within AbortGrace.
	aborting int
	abortT   timer
	// batches counts the batch requests in flight on it, each holding one
	// slot, and batched the calls of calls that run in them (batch.go).
	batches, batched int
	// bootTimedOut: stopped by the boot timeout, which counts as a failed
	// boot once the process has exited.
	bootTimedOut bool
	park         parkState // parking.go

	// phase is what its launch is doing that is not booting yet
	// (backend.PhaseBuildingEnvironment), since phaseSince; "" = none.
	phase      string
	phaseSince time.Time
	// unwanted is the launch's backend.Spec.Cancel, closed by stop while
	// Launch runs; nil once it has returned.
	unwanted chan struct{}

	// acctAt is how far its time has been charged (usage.go: account);
	// gpuWeight how many GPUs it counts as there; callShare the seconds a
	// call running on it all along would have been charged by then (calls
	// running at once share each second), from which detach charges each
	// call its part.
	acctAt    time.Time
	gpuWeight float64
	callShare float64
}

// live reports whether r counts toward its project's replicas: it is, or
// will be, serving the current spec. A retiring replica (rollout.go) serves
// an older one.
func (r *rep) live() bool { return r.state != stateStopping && !r.draining && r.gen == r.p.specGen }

// exited reports whether r's process has exited. The loop learns it from
// evExited, but a call that failed because of the exit can come back first:
// checking here keeps the next call off a dead replica meanwhile.
func (r *rep) exited() bool { return r.inst != nil && isClosed(r.inst.Exited()) }

// idle reports whether r is ready and has no call.
func (r *rep) idle() bool { return r.state == stateReady && len(r.calls) == 0 && r.aborting == 0 }

// callList returns r's calls, for loops that end them.
func (r *rep) callList() []*call {
	cs := make([]*call, 0, len(r.calls))
	for c := range r.calls {
		cs = append(cs, c)
	}
	slices.SortFunc(cs, func(a, b *call) int { return a.c.Dispatched.Compare(b.c.Dispatched) })
	return cs
}

func (r *rep) stateName() string {
	switch {
	case r.state == stateBooting:
		return ReplicaBooting
	case r.state == stateStopping:
		return ReplicaStopping
	case r.state == stateParking:
		return ReplicaParking
	case r.state == stateParked:
		return ReplicaParked
	case r.state == stateRestoring:
		return ReplicaRestoring
	case len(r.calls) > 0, r.aborting > 0: // an aborted request still holds it
		return ReplicaBusy
	default:
		return ReplicaReady
	}
}

// boot starts a replica of p on the resources given (GPU UUIDs, or a CPU
// slot). Launch runs off the loop; its outcome comes back as evLaunched. The
// boot timeout counts from now.
func (s *Scheduler) boot(p *project, gpus []string, cpuSlot bool) {
	var memMiB uint64
	if len(gpus) > 0 {
		memMiB = requestOf(p.cfg.Model).memoryMiB
	}
	p.next++
	r := &rep{
		id:        fmt.Sprintf("%s-%d", p.id, p.next),
		p:         p,
		gen:       p.specGen,
		state:     stateBooting,
		gpus:      gpus,
		gpuMemMiB: memMiB,
		cpuSlot:   cpuSlot,
		started:   s.clk.Now(),
		calls:     map[*call]struct{}{},
	}
	r.acctAt = r.started
	r.gpuWeight = gpuWeight(gpus, memMiB, s.gpuSizes())
	p.replicas = append(p.replicas, r)
	if cpuSlot {
		s.cpuUsed++
	}
	spec := launchSpec(p.cfg, r.id, gpus)
	spec.Phase = func(phase string) { s.in.post(evPhase{r: r, phase: phase}) }
	r.unwanted = make(chan struct{})
	spec.Cancel = r.unwanted
	s.arm(&r.boot, seconds(p.bootTimeout()), func(seq uint64) event { return evBootTimeout{r: r, seq: seq} })
	s.log.Info().Str("project", p.id).Str("replica", r.id).Strs("gpus", gpus).Msg("booting replica")
	s.cfg.Observer.ReplicaStarted(p.id)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		inst, err := s.backend.Launch(spec)
		if !s.in.post(evLaunched{r: r, inst: inst, err: err}) && err == nil {
			inst.Stop() // the loop has stopped: nobody else will
		}
	}()
}

// launchSpec is what the backend is asked to start for replica id of
// project p on gpus: the one place where a project becomes a launch request.
// The model spec goes whole, so a field added to it needs no change here.
func launchSpec(p store.Project, id string, gpus []string) backend.Spec {
	m := p.Model
	m.KeyHash = "" // the backend has no use for the model key's hash
	return backend.Spec{ReplicaID: id, ProjectID: p.ID, TeamID: p.TeamID, Model: m, GPUs: gpus}
}

// onPhase notes what a launching replica's backend is doing. Building
// its environment is not booting: the boot timeout stops while it builds
// and counts afresh from its end, as does the boot time measured.
func (s *Scheduler) onPhase(ev evPhase) {
	r := ev.r
	if r.state != stateBooting {
		return
	}
	r.phase = ev.phase
	if ev.phase != "" {
		r.phaseSince = s.clk.Now()
		r.boot.stop() // bootTimeout does not count the build
		s.log.Info().Str("project", r.p.id).Str("replica", r.id).Str("phase", ev.phase).Msg("replica launch: " + ev.phase)
		return
	}
	r.started = s.clk.Now()
	s.arm(&r.boot, seconds(r.p.bootTimeout()), func(seq uint64) event { return evBootTimeout{r: r, seq: seq} })
}

func (s *Scheduler) onLaunched(ev evLaunched) {
	r := ev.r
	r.unwanted = nil // Launch is over: a stop goes to the instance
	if ev.err != nil {
		s.log.Error().Err(ev.err).Str("project", r.p.id).Str("replica", r.id).Msg("launching replica failed")
		// Whatever stops a launch (no such program or dir) stops the next one
		// too: fatal, as the backend's own hopeless findings are.
		s.gone(evExited{r: r, lastLine: ev.err.Error(), problem: backend.BootProblem{Text: ev.err.Error(), Fatal: true}})
		return
	}
	r.inst = ev.inst
	r.info = ev.inst.Info()
	s.wg.Add(1)
	go s.watch(r, ev.inst)
	if r.state == stateStopping {
		s.goStop(r.inst) // stopped while launching
	}
}

// watch reports the replica's readiness and exit. It ends with the process.
func (s *Scheduler) watch(r *rep, inst backend.Instance) {
	defer s.wg.Done()
	select {
	case <-inst.Ready():
		s.in.post(evReady{r: r})
		<-inst.Exited()
	case <-inst.Exited():
	}
	s.in.post(evExited{r: r, exitErr: inst.ExitErr(), lastLine: inst.LastLogLine(), problem: inst.BootProblem()})
}

func (s *Scheduler) onReady(r *rep) {
	if r.state != stateBooting {
		return
	}
	now := s.clk.Now()
	s.account(r, now) // its boot
	r.state = stateReady
	r.readyAt = now
	r.idleSince = now
	r.boot.stop()
	r.p.est.booted(now.Sub(r.started))
	if r.live() {
		r.p.bootFailures = 0
		r.p.backoff = 0
		r.p.lastBoot, r.p.refusing = bootFailure{}, false
		r.p.warmed(nil)
		s.retireOne(r.p, "a replica of the new spec is ready; retiring an old one")
	}
	s.log.Info().Str("project", r.p.id).Str("replica", r.id).Int("pid", r.info.Pid).
		Stringer("boot", now.Sub(r.started).Round(time.Millisecond)).Msg("replica ready")
}

func (s *Scheduler) onBootTimeout(r *rep, seq uint64) {
	if !r.boot.fired(seq) || r.state != stateBooting {
		return
	}
	s.log.Warn().Str("project", r.p.id).Str("replica", r.id).Int("bootTimeout", r.p.bootTimeout()).
		Msg("replica not ready in time; stopping it")
	r.bootTimedOut = true
	// Back off now, not when the process has exited: otherwise the pass
	// that follows would boot a replacement at once.
	s.startBackoff(r.p)
	s.stop(r)
}

func (s *Scheduler) onIdleExpired(r *rep, seq uint64) {
	if !r.idleT.fired(seq) || !(r.idle() || r.state == stateParked) || !r.live() {
		return
	}
	if p := r.p; p.live() > p.want() {
		s.log.Info().Str("project", p.id).Str("replica", r.id).Msg("replica idle; stopping it")
		s.stop(r)
	}
}

// stop asks r to stop. Its resources stay taken until its process has
// exited (onExited).
func (s *Scheduler) stop(r *rep) {
	if r.state == stateStopping {
		return
	}
	s.account(r, s.clk.Now()) // a boot's time is boot time up to here
	r.state = stateStopping
	r.boot.stop()
	r.idleT.stop()
	r.abortT.stop()
	r.park.stop()
	if r.inst != nil {
		s.goStop(r.inst)
	} else if r.unwanted != nil {
		close(r.unwanted) // still launching: a build may give up
		r.unwanted = nil
	}
}

func (s *Scheduler) onExited(ev evExited) {
	s.gone(ev)
}

// gone handles a replica whose process has exited (or never started):
// its calls fail, its resources are freed, and a failure that was not asked
// for counts toward the boot failures or the restart backoff.
func (s *Scheduler) gone(ev evExited) {
	r, lastLine, exitErr := ev.r, ev.lastLine, ev.exitErr
	p := r.p
	was := r.state
	s.account(r, s.clk.Now()) // the last of its time, before its calls end
	if was != stateStopping {
		s.cfg.Observer.ReplicaCrashed(p.id) // nobody asked it to stop
	}
	if oom := (*backend.OutOfMemoryError)(nil); errors.As(exitErr, &oom) {
		p.oomKills++
		s.cfg.Observer.ReplicaOOMKilled(p.id)
	}
	r.state = stateStopping
	r.boot.stop()
	r.idleT.stop()
	r.park.stop()
	p.replicas = slices.DeleteFunc(p.replicas, func(q *rep) bool { return q == r })
	if r.cpuSlot {
		s.cpuUsed--
		r.cpuSlot = false
	}
	if r.holdsGPUs() {
		s.releaseGPUs(r, s.devices())
	}
	r.abortT.stop()
	for _, c := range r.callList() {
		end := batchOf(c, failed(store.FailModel, msgExited(exitErr)))
		s.detach(c)
		if !s.retry(c) {
			s.finish(c, nil, end)
		}
	}
	log := s.log.With().Str("project", p.id).Str("replica", r.id).Str("exit", exitStatus(exitErr)).Logger()
	switch {
	case p.deleted:
		if len(p.replicas) == 0 {
			s.removeProject(p)
		}
	case r.gen != p.specGen:
		// An old spec's replica: its failures say nothing about the new one.
	case r.bootTimedOut:
		s.bootFailed(p, r, bootTimedOut(p.bootTimeout(), ev.problem, lastLine), false)
	case was == stateBooting && ev.problem.Fatal:
		f := bootFailure{text: ev.problem.Text, short: ev.problem.Text, fatal: true}
		if lastLine != "" && !strings.Contains(f.text, lastLine) {
			f.text += "; last output: " + lastLine
		}
		s.bootFailed(p, r, f, true)
	case was == stateBooting:
		s.bootFailed(p, r, bootExited(exitErr, lastLine), true)
	case was.warm():
		p.lastError = fmt.Sprintf("replica %s exited (%s)", r.id, exitStatus(exitErr))
		if lastLine != "" {
			p.lastError += ": " + lastLine
		}
		p.lastErrorReplica, p.lastErrorAt = r.id, s.clk.Now()
		log.Warn().Str("lastLine", lastLine).Msg("replica exited unexpectedly")
		s.startBackoff(p)
	default:
		log.Info().Msg("replica stopped")
	}
}

// startBackoff holds the project's boots back for its current backoff, and
// doubles the next one up to MaxRestartBackoff. A replica getting ready
// resets it.
func (s *Scheduler) startBackoff(p *project) {
	d := p.backoff
	if d <= 0 {
		d = s.cfg.RestartBackoff
	}
	p.backoff = min(2*d, s.cfg.MaxRestartBackoff)
	s.arm(&p.backoffT, d, func(seq uint64) event { return evBackoffDone{p: p, seq: seq} })
}
