package scheduler

import (
	"errors"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// The usage ledger's side in the loop (DESIGN.md "Batching, usage, ETA").
//
// Every second of every replica, from its boot to its exit, is charged
// once: to the calls it runs (shared evenly among those running at once),
// or, when it runs none, to its project as boot or idle time (idle:
// ready with nothing to do, kept by minReplicas or waiting out its
// idleTimeout; stopping counts as idle, as the project's replica still
// holds its slot or GPU; parked counts as idle too, but without
// GPU-seconds: its GPUs are free for others). account moves a replica's clock up to now and
// is called before anything changes what the replica is doing.
//
// A call's share goes into its final record (finish: one write, which the
// store rolls up by hour in the same commit). Boot and idle time collect
// here, per hour, team and project, and are written every
// Config.UsageFlush with Store.AddUsage, off the loop, and once more at
// shutdown. A crash loses at most the last UsageFlush of boot and idle
// time, never a call's share (that is in the call's own record), and
// nothing is counted twice: a call's record adds to the roll-up only with
// its first final write, and the replica time written is taken out of
// memory when its write is started (given back if it fails).

// account charges r's time since it was last accounted, up to now.
func (s *Scheduler) account(r *rep, now time.Time) {
	from := r.acctAt
	r.acctAt = now
	if from.IsZero() || !now.After(from) {
		return
	}
	dt := now.Sub(from).Seconds()
	switch {
	case len(r.calls) > 0:
		// Each running call's share; detach adds it up for the call (a
		// loop over the calls here cost O(concurrency) per event).
		r.callShare += dt / float64(len(r.calls))
	case r.state == stateBooting:
		s.chargeReplica(r, from, now, true)
	default:
		s.chargeReplica(r, from, now, false)
	}
}

// chargeReplica adds r's boot or idle time over [from, to) to its project's
// hourly rows, split at the hours it spans.
func (s *Scheduler) chargeReplica(r *rep, from, to time.Time, booting bool) {
	p := r.p
	for from.Before(to) {
		end := store.UsageHour(from).Add(time.Hour)
		if end.After(to) {
			end = to
		}
		secs := end.Sub(from).Seconds()
		weight := r.gpuWeight
		if r.park.released {
			weight = 0 // parked: its time is the project's, its GPUs are not (parking.go)
		}
		row := s.pendingRow(store.UsageKey{Hour: store.UsageHour(from), TeamID: p.cfg.TeamID, ProjectID: p.id})
		if booting {
			row.BootReplicaSeconds += secs
			row.BootGPUSeconds += secs * weight
		} else {
			row.IdleReplicaSeconds += secs
			row.IdleGPUSeconds += secs * weight
		}
		from = end
	}
}

// pendingRow is the row of k not written yet, made on first use.
func (s *Scheduler) pendingRow(k store.UsageKey) *store.UsageRow {
	if s.usage == nil {
		s.usage = map[store.UsageKey]*store.UsageRow{}
	}
	row := s.usage[k]
	if row == nil {
		row = &store.UsageRow{Hour: k.Hour, TeamID: k.TeamID, ProjectID: k.ProjectID}
		s.usage[k] = row
	}
	return row
}

// gpuWeight is how many GPUs a replica holding gpus with memMiB each (0 =
// whole) counts as: a share of a GPU by memory counts as its fraction of
// the GPU's memory.
func gpuWeight(gpus []string, memMiB uint64, devices []gpuSize) float64 {
	if memMiB == 0 {
		return float64(len(gpus))
	}
	w := 0.0
	for _, id := range gpus {
		for _, d := range devices {
			if d.uuid == id && d.totalMiB > 0 {
				w += min(float64(memMiB)/float64(d.totalMiB), 1)
			}
		}
	}
	return w
}

// gpuSize is a device's total memory, for gpuWeight.
type gpuSize struct {
	uuid     string
	totalMiB uint64
}

func (s *Scheduler) gpuSizes() []gpuSize {
	devs := s.devices()
	out := make([]gpuSize, 0, len(devs))
	for _, d := range devs {
		out = append(out, gpuSize{uuid: d.UUID, totalMiB: d.MemoryTotalMiB})
	}
	return out
}

// callUsage is the ledger entry of call c as it finishes after running
// runMs with outputs out: its replica share (accounted up to its detach),
// the tokens its model reported (an OpenAI-compatible one), and what the
// backend measured over its run, taken at the call's share of the replica.
func callUsage(c *call, runMs int64, out []byte) *store.CallUsage {
	u := &store.CallUsage{
		ReplicaSeconds: c.replicaSeconds,
		GPUSeconds:     c.replicaSeconds * c.gpuWeight,
		BytesIn:        c.bytes,
		BytesOut:       int64(len(out)),
	}
	if t := c.c.Tokens; t != nil {
		u.PromptTokens, u.CompletionTokens = t.Prompt, t.Completion
	}
	m := c.measured
	if m == nil {
		return u
	}
	// A call alone on its replica is charged all it measured; calls that
	// ran at once split it as they split the replica's time.
	share := 1.0
	if run := float64(runMs) / 1000; run > 0 && c.replicaSeconds < run {
		share = c.replicaSeconds / run
	}
	if m.CPUKnown {
		cpu := m.CPU.Seconds() * share
		u.CPUSeconds = &cpu
	}
	u.PeakMemoryBytes = m.PeakMemoryBytes
	if m.EnergyJoules != nil {
		j := *m.EnergyJoules * share
		if c.gpuWeight > 0 && c.gpuWeight < float64(c.gpus) {
			j *= c.gpuWeight / float64(c.gpus) // a memory share of a GPU: that share of its energy
		}
		u.EnergyJoules = &j
	}
	return u
}

// measure starts measuring inst for one call, when its backend can; the
// returned function ends it (nil result when it cannot).
func measure(inst backend.Instance) func() *backend.Usage {
	m, ok := inst.(backend.Metered)
	if !ok {
		return func() *backend.Usage { return nil }
	}
	end := m.Measure()
	return func() *backend.Usage {
		u := end()
		return &u
	}
}

// flushUsage accounts every replica up to now and writes the boot and idle
// time collected so far, off the loop. A failed write gives its rows back
// to the next flush. The timer is re-armed by the caller.
func (s *Scheduler) flushUsage() {
	now := s.clk.Now()
	for _, p := range s.order {
		for _, r := range p.replicas {
			s.account(r, now)
		}
	}
	rows := s.takeUsage()
	if len(rows) == 0 {
		return
	}
	s.cfg.Observer.ReplicaUsage(rows)
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		err := s.st.AddUsage(rows)
		switch {
		case errors.Is(err, store.ErrUnavailable):
			// No quorum: told once per outage, kept for the next try.
			if !s.usageDown.Swap(true) && s.cfg.Outages != nil {
				s.cfg.Outages.Down("write replica usage", err)
			}
		case err != nil:
			s.log.Warn().Err(err).Int("rows", len(rows)).Msg("writing replica usage failed; kept for the next try")
		case s.usageDown.Swap(false) && s.cfg.Outages != nil:
			s.cfg.Outages.Up("write replica usage")
		}
		if err != nil {
			s.in.post(evUsageFailed{rows: rows}) // after shutdown: lost with the process
		}
	}()
}

// takeUsage returns the rows collected and forgets them.
func (s *Scheduler) takeUsage() []store.UsageRow {
	if len(s.usage) == 0 {
		return nil
	}
	rows := make([]store.UsageRow, 0, len(s.usage))
	for _, r := range s.usage {
		rows = append(rows, *r)
	}
	clear(s.usage)
	return store.SumUsage(rows)
}

// maxPendingUsageRows bounds the rows kept in memory while writes fail:
// an hour, team and project each; more means the store has been refusing
// writes for days, and the oldest are dropped.
const maxPendingUsageRows = 10000

// onUsageFailed takes back rows whose write failed, for the next flush.
func (s *Scheduler) onUsageFailed(rows []store.UsageRow) {
	for _, r := range rows {
		if len(s.usage) >= maxPendingUsageRows {
			return
		}
		s.pendingRow(r.Key()).Add(r)
	}
}

// evUsageFailed: a replica usage write failed; its rows come back.
type evUsageFailed struct{ rows []store.UsageRow }

func (evUsageFailed) isEvent() {}

// evUsageFlush: the usage flush timer fired.
type evUsageFlush struct{ seq uint64 }

func (evUsageFlush) isEvent() {}

// armUsageFlush times the next flush.
func (s *Scheduler) armUsageFlush() {
	s.arm(&s.usageT, s.cfg.UsageFlush, func(seq uint64) event { return evUsageFlush{seq: seq} })
}

func (s *Scheduler) onUsageFlush(seq uint64) {
	if !s.usageT.fired(seq) {
		return
	}
	s.flushUsage()
	s.armUsageFlush()
}

// flushUsageAtShutdown writes what the replicas used up to now, and waits
// for it: the store closes after the scheduler.
func (s *Scheduler) flushUsageAtShutdown() {
	now := s.clk.Now()
	for _, p := range s.order {
		for _, r := range p.replicas {
			s.account(r, now)
		}
	}
	rows := s.takeUsage()
	if len(rows) == 0 {
		return
	}
	s.cfg.Observer.ReplicaUsage(rows)
	if err := s.st.AddUsage(rows); err != nil {
		s.log.Warn().Err(err).Int("rows", len(rows)).Msg("writing replica usage at shutdown failed; it is lost")
	}
}
