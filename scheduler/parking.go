package scheduler

import (
	"context"
	"errors"
	"slices"
	"time"

	"inferd/gpu"
	"inferd/scheduler/backend"
)

// Parking (docs/gpu.md "Parking"): a GPU replica idle for its project's
// parkTimeout is parked: the backend (a backend.Checkpointer) moves its GPU
// memory to host memory and freezes it, and its GPUs count as free, so other
// projects may be placed on them. A call to the project restores it onto the
// same GPUs, in a fraction of a cold boot. Parking is off unless a project
// sets parkTimeout.
//
//	ready ──parkTimeout idle──▶ parking ──Park ok──▶ parked ──a call──▶ restoring ──Restore ok──▶ ready
//
// Every failure ends in a stop, so that the next call gets a cold boot
// through the ordinary scale-up:
//   - Park says the machine cannot park (backend.ErrParkUnsupported): the
//     replica is ready again, untouched, and the project parks no more
//     (parkOff, on the status page) until its spec changes.
//   - Park fails otherwise, or outlasts bootTimeout: the replica is stopped
//     (its state is unknown) and the project parks no more until its spec
//     changes, so that a broken driver does not turn every idle spell into
//     a cold boot.
//   - The GPUs are taken when a call comes (another project was placed on
//     them, or memory used outside inferd fills them): the parked replica is
//     stopped and a fresh one boots wherever placement finds room.
//   - Restore fails, or outlasts bootTimeout: the replica is stopped.
//
// A parked replica stays live: it counts toward minReplicas and
// maxReplicas, toward its team's replicas and gpus quotas (it takes its GPUs
// back on the next call), and its idleTimeout still stops it when the
// project has more replicas than it wants. It is never evicted (it holds
// no GPU) and never sent a call.

// The replica states of parking, beside those of replica.go.
const (
	stateParking   replicaState = iota + stateStopping + 1 // Park in flight: still holds its GPUs, takes no calls
	stateParked                                            // frozen, its GPU memory in host memory; holds no GPU
	stateRestoring                                         // Restore in flight: holds its GPUs again, takes no calls
)

// parkState is one replica's parking bookkeeping.
type parkState struct {
	due    timer              // armed while idle: parks it when it fires
	op     timer              // armed while Park or Restore runs: bounds it
	cancel context.CancelFunc // ends the Park or Restore in flight; nil when none
	began  time.Time          // when the Park or Restore in flight began
	since  time.Time          // when it was parked
	// released: its GPUs are handed back (it is parked, or stopping
	// from parked): placement, eviction and the status count them free.
	released bool
}

// stop disarms the timers and ends the operation in flight.
func (ps *parkState) stop() {
	ps.due.stop()
	ps.op.stop()
	if ps.cancel != nil {
		ps.cancel()
		ps.cancel = nil
	}
}

// warm reports whether a replica in state st had booted: ready, or in or
// out of parking. Its unexpected exit is a crash of a serving replica.
func (st replicaState) warm() bool {
	return st == stateReady || st == stateParking || st == stateParked || st == stateRestoring
}

// holdsGPUs reports whether r holds GPUs now: it has some and has not
// handed them back by parking.
func (r *rep) holdsGPUs() bool { return len(r.gpus) > 0 && !r.park.released }

// ParkObserver is told of parking, for metrics. An Observer that is also a
// ParkObserver is told; its methods run on the loop and must not block.
type ParkObserver interface {
	// ReplicaParked reports a replica parked, and how long Park took.
	ReplicaParked(project string, took time.Duration)
	// ReplicaRestored reports a parked replica ready again, and how long
	// Restore took.
	ReplicaRestored(project string, took time.Duration)
	// ParkFailed reports a Park that failed or timed out (the replica is
	// stopped).
	ParkFailed(project string)
	// RestoreFailed reports a parked replica that could not be restored,
	// and why: RestoreGPUTaken, RestoreFailed or RestoreTimedOut. It is
	// stopped, and a cold boot serves the call.
	RestoreFailed(project, reason string)
}

// The reasons of ParkObserver.RestoreFailed.
const (
	RestoreGPUTaken = "gpu_taken" // its GPUs went to others meanwhile
	RestoreError    = "failed"    // Restore returned an error
	RestoreTimedOut = "timeout"   // Restore outlasted bootTimeout
)

// Events of parking. They all reach the loop through one case of handle.
type (
	// evParkDue: r's parkTimeout has passed while it was idle.
	evParkDue struct {
		r   *rep
		seq uint64
	}
	// evParkOpTimeout: r's Park or Restore has outlasted bootTimeout.
	evParkOpTimeout struct {
		r   *rep
		seq uint64
	}
	// evParked: Park returned.
	evParked struct {
		r      *rep
		report backend.ParkReport
		err    error
	}
	// evRestored: Restore returned.
	evRestored struct {
		r   *rep
		err error
	}
)

// parkEvent is any of the events above.
type parkEvent interface {
	event
	parkEvent()
}

func (evParkDue) isEvent()       {}
func (evParkOpTimeout) isEvent() {}
func (evParked) isEvent()        {}
func (evRestored) isEvent()      {}

func (evParkDue) parkEvent()       {}
func (evParkOpTimeout) parkEvent() {}
func (evParked) parkEvent()        {}
func (evRestored) parkEvent()      {}

func (s *Scheduler) onParkEvent(ev parkEvent) {
	switch ev := ev.(type) {
	case evParkDue:
		s.onParkDue(ev.r, ev.seq)
	case evParkOpTimeout:
		s.onParkOpTimeout(ev.r, ev.seq)
	case evParked:
		s.onParked(ev)
	case evRestored:
		s.onRestored(ev)
	}
}

// checkpointer is the backend's parking, or nil when it cannot park.
func (s *Scheduler) checkpointer() backend.Checkpointer {
	cp, _ := s.backend.(backend.Checkpointer)
	return cp
}

// tidyParking is p's part of the scheduling pass: parked replicas are
// restored for the calls that need them, parked replicas beyond
// maxReplicas stop, and idle replicas that may park get their park timer.
func (s *Scheduler) tidyParking(p *project) {
	if p.parkOffGen != p.specGen {
		p.parkOff = "" // a new spec may park again
	}
	if p.deleted {
		return
	}
	s.restoreForCalls(p)
	for live := p.live(); live > p.maxReplicas(); live-- {
		i := slices.IndexFunc(p.replicas, func(r *rep) bool { return r.live() && r.state == stateParked })
		if i < 0 {
			break
		}
		s.stop(p.replicas[i])
	}
	after := seconds(p.cfg.Model.ParkTimeout)
	var now time.Time // read only to arm a timer: this runs after every event, for every project
	for _, r := range p.replicas {
		switch {
		case !s.mayPark(p, r):
			r.park.due.stop()
		case !r.park.due.armed():
			if now.IsZero() {
				now = s.clk.Now()
			}
			s.arm(&r.park.due, max(after-now.Sub(r.idleSince), 0), func(seq uint64) event { return evParkDue{r: r, seq: seq} })
		}
	}
}

// mayPark reports whether r may park now: its project parks, it is a live
// GPU replica, ready and idle, and no call of its project waits.
func (s *Scheduler) mayPark(p *project, r *rep) bool {
	return p.cfg.Model.ParkTimeout > 0 && p.parkOff == "" && !p.deleted &&
		r.live() && r.idle() && len(r.gpus) > 0 && p.queue.len() == 0 && len(p.warmers) == 0
}

// restoreForCalls restores as many of p's parked replicas as its calls
// (and warm-ups) need beyond the replicas that serve or soon will.
func (s *Scheduler) restoreForCalls(p *project) {
	var parked []*rep
	warm, load := 0, p.queue.len()
	for _, r := range p.replicas {
		if !r.live() {
			continue
		}
		load += len(r.calls)
		switch r.state {
		case stateParked:
			parked = append(parked, r)
		case stateParking: // restored once parked, if still wanted
		default:
			warm++
		}
	}
	if len(parked) == 0 {
		return
	}
	need := (load + p.callsPerReplica() - 1) / p.callsPerReplica()
	if len(p.warmers) > 0 {
		need = max(need, 1)
	}
	need = min(need, p.maxReplicas())
	for _, r := range parked[:min(max(need-warm, 0), len(parked))] {
		s.restore(r)
	}
}

// onParkDue parks r if it still may.
func (s *Scheduler) onParkDue(r *rep, seq uint64) {
	if !r.park.due.fired(seq) || !s.mayPark(r.p, r) {
		return
	}
	cp := s.checkpointer()
	if cp == nil {
		s.parkingOff(r.p, "this backend cannot park replicas")
		return
	}
	s.park(r, cp)
}

// park starts checkpointing r off the loop; evParked reports the outcome.
func (s *Scheduler) park(r *rep, cp backend.Checkpointer) {
	r.state = stateParking
	ctx := s.parkOp(r)
	inst := r.inst
	s.log.Info().Str("project", r.p.id).Str("replica", r.id).Msg("parking idle replica")
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		report, err := cp.Park(ctx, inst)
		s.in.post(evParked{r: r, report: report, err: err}) // after shutdown: the shutdown stops r
	}()
}

// parkOp begins a Park or Restore of r: bounded by the project's
// bootTimeout (a restore slower than a boot is no use) and ended by stop.
func (s *Scheduler) parkOp(r *rep) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	r.park.cancel = cancel
	r.park.began = s.clk.Now()
	s.arm(&r.park.op, seconds(r.p.bootTimeout()), func(seq uint64) event { return evParkOpTimeout{r: r, seq: seq} })
	return ctx
}

// endParkOp ends the bookkeeping of r's Park or Restore and returns how
// long it took.
func (s *Scheduler) endParkOp(r *rep) time.Duration {
	r.park.op.stop()
	if r.park.cancel != nil {
		r.park.cancel()
		r.park.cancel = nil
	}
	return s.clk.Now().Sub(r.park.began)
}

func (s *Scheduler) onParked(ev evParked) {
	r, p := ev.r, ev.r.p
	if r.state != stateParking {
		return // stopped meanwhile
	}
	took := s.endParkOp(r)
	log := s.log.With().Str("project", p.id).Str("replica", r.id).Logger()
	switch {
	case errors.Is(ev.err, backend.ErrParkUnsupported):
		r.state = stateReady // untouched: serves as before
		s.parkingOff(p, ev.err.Error())
	case ev.err != nil:
		log.Warn().Err(ev.err).Msg("parking failed; stopping the replica (the next call boots a fresh one)")
		s.parkObserver().ParkFailed(p.id)
		s.parkingOff(p, "parking failed: "+ev.err.Error())
		s.stop(r)
	default:
		s.account(r, s.clk.Now()) // its GPUs charged up to here, no further
		r.state = stateParked
		r.park.since = s.clk.Now()
		// Its memory is back in the driver's free figure only from the
		// next read: until then the release holds its GPUs (placement.go).
		s.releaseGPUs(r, s.devices())
		r.park.released = true
		s.parkObserver().ReplicaParked(p.id, took)
		log.Info().Dur("took", took).Int("cudaProcesses", ev.report.CUDAProcesses).Msg("replica parked; its GPUs are free")
	}
}

// restore starts restoring parked replica r for a call, if its GPUs can
// take it back; else it is stopped and the call gets a cold boot.
func (s *Scheduler) restore(r *rep) {
	p := r.p
	if !s.restoreFits(r) {
		s.log.Info().Str("project", p.id).Str("replica", r.id).Strs("gpus", r.gpus).
			Msg("a parked replica's GPUs are taken; stopping it for a cold boot")
		s.parkObserver().RestoreFailed(p.id, RestoreGPUTaken)
		s.stop(r)
		return
	}
	s.account(r, s.clk.Now()) // parked time: no GPU-seconds
	s.dropRelease(r)
	r.park.released = false
	r.state = stateRestoring
	ctx := s.parkOp(r)
	inst, cp := r.inst, s.checkpointer()
	s.log.Info().Str("project", p.id).Str("replica", r.id).Msg("restoring parked replica")
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := cp.Restore(ctx, inst)
		s.in.post(evRestored{r: r, err: err})
	}()
}

func (s *Scheduler) onRestored(ev evRestored) {
	r, p := ev.r, ev.r.p
	if r.state != stateRestoring {
		return // stopped meanwhile
	}
	took := s.endParkOp(r)
	if ev.err != nil {
		s.log.Warn().Err(ev.err).Str("project", p.id).Str("replica", r.id).
			Msg("restoring a parked replica failed; stopping it (a fresh replica boots)")
		s.parkObserver().RestoreFailed(p.id, RestoreError)
		s.stop(r)
		return
	}
	now := s.clk.Now()
	r.state = stateReady
	r.readyAt, r.idleSince = now, now // a call that waited for it counts the wait as boot time
	r.park.since = time.Time{}
	if !r.draining {
		p.warmed(nil)
	}
	s.parkObserver().ReplicaRestored(p.id, took)
	s.log.Info().Str("project", p.id).Str("replica", r.id).Dur("took", took).Msg("replica restored")
}

func (s *Scheduler) onParkOpTimeout(r *rep, seq uint64) {
	if !r.park.op.fired(seq) {
		return
	}
	p := r.p
	log := s.log.Warn().Str("project", p.id).Str("replica", r.id).Int("bootTimeout", p.bootTimeout())
	switch r.state {
	case stateParking:
		log.Msg("parking outlasted bootTimeout; stopping the replica")
		s.parkObserver().ParkFailed(p.id)
		s.parkingOff(p, "parking outlasted bootTimeout")
	case stateRestoring:
		log.Msg("restoring outlasted bootTimeout; stopping the replica (a fresh replica boots)")
		s.parkObserver().RestoreFailed(p.id, RestoreTimedOut)
	default:
		return
	}
	s.stop(r)
}

// parkingOff stops p's parking until its spec changes, and says why, once.
func (s *Scheduler) parkingOff(p *project, why string) {
	if p.parkOff == "" {
		s.log.Warn().Str("project", p.id).Str("why", why).
			Msg("parking off for this project: its idle replicas stay warm until idleTimeout")
	}
	p.parkOff, p.parkOffGen = why, p.specGen
}

// restoreFits reports whether r's GPUs can take it back now. While the
// driver has not been read since r parked, its release still holds them
// (placement.go): nobody else can have them. Otherwise its own request is
// placed on its own GPUs beside every other hold, as a new replica's would
// be, with its own processes (a context the checkpoint left, or one still
// exiting the GPU) not counted as another's.
func (s *Scheduler) restoreFits(r *rep) bool {
	devices := s.devices()
	s.pruneReleases(devices)
	if slices.ContainsFunc(s.releasing, func(rl release) bool { return rl.replica == r.id }) {
		return true
	}
	held := slices.Clone(s.assignments())
	all := append(held, assignment{replica: r.id, group: r.info.Pid})
	s.attribute(all, devices)
	own := all[len(all)-1].pids
	var mine []gpu.Device
	for _, d := range devices {
		if slices.Contains(r.gpus, d.UUID) {
			d.Processes = slices.DeleteFunc(slices.Clone(d.Processes), func(pr gpu.Process) bool { return slices.Contains(own, pr.Pid) })
			mine = append(mine, d)
		}
	}
	got, ok := place(mine, held, placementRequest{gpus: len(r.gpus), memoryMiB: r.gpuMemMiB})
	return ok && len(got) == len(r.gpus)
}

// dropRelease forgets the release r's park left: r takes its memory back.
func (s *Scheduler) dropRelease(r *rep) {
	s.releasing = slices.DeleteFunc(s.releasing, func(rl release) bool { return rl.replica == r.id })
}

// parkObserver is the Observer's ParkObserver side, or one that ignores.
func (s *Scheduler) parkObserver() ParkObserver {
	if o, ok := s.cfg.Observer.(ParkObserver); ok {
		return o
	}
	return nopParkObserver{}
}

type nopParkObserver struct{}

func (nopParkObserver) ReplicaParked(string, time.Duration)   {}
func (nopParkObserver) ReplicaRestored(string, time.Duration) {}
func (nopParkObserver) ParkFailed(string)                     {}
func (nopParkObserver) RestoreFailed(string, string)          {}
