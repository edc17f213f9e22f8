package scheduler

import (
	"slices"
	"time"

	"inferd/store"
)

// Status is the scheduler's state at one moment, for the status page and
// metrics. It holds no call inputs or outputs.
type Status struct {
	Projects     []ProjectStatus `json:"projects"` // sorted by id
	GPUs         []GPUStatus     `json:"gpus"`     // one per inventory device, in its order
	CPUSlots     int             `json:"cpuSlots"`
	CPUSlotsUsed int             `json:"cpuSlotsUsed"`
	Teams        []TeamStatus    `json:"teams"` // each team's use against its quota, sorted by id
}

// ReservedMiB indexes the GPU hand-outs by UUID (gpu.MemoryOf's
// reservations).
func (st Status) ReservedMiB() map[string]uint64 {
	out := make(map[string]uint64, len(st.GPUs))
	for _, g := range st.GPUs {
		out[g.UUID] = g.ReservedMiB
	}
	return out
}

// GPUStatus is what inferd has handed out on one GPU: its own bookkeeping,
// which moves at once, while the driver's figures (the inventory's free
// memory) follow only as model servers allocate and free, and never for
// simulated GPUs.
type GPUStatus struct {
	UUID string `json:"uuid"`
	// ReservedMiB is the whole GPU while a whole-GPU replica holds it, else
	// the sum of the holders' gpuMemoryMiB shares.
	ReservedMiB uint64 `json:"reservedMiB"`
	// Replicas are the holders: live replicas (stopping ones included) in
	// project and start order, then exited ones whose memory the driver has
	// not shown back yet. Never nil.
	Replicas []string `json:"replicas"`
}

// The reasons in ProjectStatus.Waiting.
const (
	WaitingCPU = waitingCPU // no CPU slot free (cpuSlots)
	WaitingGPU = waitingGPU // no GPU, or not enough of one, free
)

// ProjectStatus is one project's queue and replicas.
type ProjectStatus struct {
	ID          string `json:"id"`
	TeamID      string `json:"teamId"`
	MinReplicas int    `json:"minReplicas"`
	MaxReplicas int    `json:"maxReplicas"`
	// NodeMinReplicas and NodeMaxReplicas are, in cluster mode, this
	// node's share of the project's replicas now (Config.Share; see
	// maxReplicas for the one a call here always gets); absent on a
	// single box, where the project's own bounds apply.
	NodeMinReplicas int    `json:"nodeMinReplicas,omitempty"`
	NodeMaxReplicas int    `json:"nodeMaxReplicas,omitempty"`
	Queued          int    `json:"queued"`
	Running         int    `json:"running"`
	Waiting         string `json:"waiting"` // "", "waiting for CPU slot", "waiting for GPU", "waiting: team T is at its Q quota (N)", or its boot retries (bootfail.go)
	// HeldBy says why, waiting with no replica, it gets no CPU slot or GPU
	// while other projects' minimums hold them (its calls' WaitingFor):
	// its Text names no project, its Named names them for the callers
	// who may see them all (store.Wait.Shown).
	HeldBy    *store.Wait     `json:"heldBy,omitempty"`
	LastError string          `json:"lastError"` // the last failed boot or crash
	OOMKills  int             `json:"oomKills"`  // replicas killed for going over memoryMiB, since the daemon started
	Replicas  []ReplicaStatus `json:"replicas"`  // in start order

	// LastErrorAt is when LastError happened (zero without one), and
	// LastErrorReplica the replica it happened to, whose log tells more
	// ("" when it was no replica's, as for a GPU request the box cannot meet).
	LastErrorAt      time.Time `json:"lastErrorAt,omitzero"`
	LastErrorReplica string    `json:"lastErrorReplica,omitempty"`

	// Batches is how many batches a project that batches has sent since
	// the daemon started, and MeanBatchSize their mean number of calls.
	Batches       int64   `json:"batches,omitempty"`
	MeanBatchSize float64 `json:"meanBatchSize,omitempty"`

	// ParkingOff says why a project with parkTimeout parks no more (the
	// machine cannot, or a park failed) until its spec changes; "" while
	// it may (docs/gpu.md "Parking").
	ParkingOff string `json:"parkingOff,omitempty"`
	// Queue is the first maxStatusQueue calls of the queue in the order
	// they would be dispatched, each with why it waits and its estimate.
	Queue []QueuedCall `json:"queue"`
}

// maxStatusQueue bounds the queued calls a project's status lists.
const maxStatusQueue = 20

// QueuedCall is one queued call as the status page shows it.
type QueuedCall struct {
	ID            string `json:"id"`
	QueuePosition int    `json:"queuePosition"`
	ETAMs         *int64 `json:"etaMs"` // null: nothing measured says
	// ETARangeMs is the range of ETAMs: the same estimate from the
	// project's 10th and 90th percentile runs; null with it.
	ETARangeMs *[2]int64   `json:"etaRangeMs"`
	WaitingFor *store.Wait `json:"waitingFor"`
}

// The states of ReplicaStatus.State, as the status API, the metrics and
// cluster placement name them. Busy is not a state of the loop's: it is a
// ready replica with calls in flight.
const (
	ReplicaBooting  = "booting"
	ReplicaReady    = "ready"
	ReplicaBusy     = "busy"
	ReplicaStopping = "stopping"
	// Parking's (parking.go): an idle GPU replica being parked, parked
	// (its GPUs free for others), being restored for a call.
	ReplicaParking   = "parking"
	ReplicaParked    = "parked"
	ReplicaRestoring = "restoring"
)

// ReplicaStates lists the states in the order of a replica's life, then
// parking's.
var ReplicaStates = []string{ReplicaBooting, ReplicaReady, ReplicaBusy, ReplicaStopping, ReplicaParking, ReplicaParked, ReplicaRestoring}

// ReplicaStatus is one replica.
type ReplicaStatus struct {
	ID         string    `json:"id"`
	State      string    `json:"state"` // one of ReplicaStates
	Pid        int       `json:"pid"`
	GPUs       []string  `json:"gpus"`
	Started    time.Time `json:"started"`
	InFlight   int       `json:"inFlight"`
	IdleSince  time.Time `json:"idleSince,omitzero"`  // set while ready with no call
	IdleExpiry time.Time `json:"idleExpiry,omitzero"` // when the idle timeout stops it, if armed
	// ParkedSince is when it was parked, while it is: its GPUs are free
	// for others (GPUs still names them: a call restores it there).
	ParkedSince time.Time `json:"parkedSince,omitzero"`
	// PreviousSpec: it was started from an earlier spec of its project and
	// serves until a replica of the current one replaces it, or finishes
	// its calls (rollout.go).
	PreviousSpec bool `json:"previousSpec,omitempty"`
}

func (s *Scheduler) snapshot() Status {
	st := Status{CPUSlots: s.cpuSlots(), CPUSlotsUsed: s.cpuUsed}
	st.Projects = make([]ProjectStatus, 0, len(s.order))
	for _, p := range s.order {
		if p.deleted {
			continue
		}
		ps := ProjectStatus{
			ID:          p.id,
			TeamID:      p.cfg.TeamID,
			MinReplicas: p.cfg.MinReplicas,
			MaxReplicas: p.cfg.MaxReplicas,
			Queued:      p.queue.len(),
			Running:     p.running,
			Waiting:     s.waitingText(p),
			HeldBy:      p.heldBy,
			LastError:   p.lastError,
			OOMKills:    p.oomKills,
			Replicas:    make([]ReplicaStatus, 0, len(p.replicas)),

			LastErrorAt:      p.lastErrorAt,
			LastErrorReplica: p.lastErrorReplica,
			ParkingOff:       p.parkOff,
		}
		if p.clustered {
			ps.NodeMinReplicas, ps.NodeMaxReplicas = p.minReplicas(), p.maxReplicas()
		}
		ps.Queue = s.queueStatus(p)
		if p.batches > 0 {
			ps.Batches, ps.MeanBatchSize = p.batches, float64(p.batchedCalls)/float64(p.batches)
		}
		for _, r := range p.replicas {
			rs := ReplicaStatus{
				ID:           r.id,
				State:        r.stateName(),
				Pid:          r.info.Pid,
				GPUs:         slices.Clone(r.gpus),
				Started:      r.started,
				InFlight:     len(r.calls),
				IdleExpiry:   r.idleT.at,
				PreviousSpec: r.gen != p.specGen,
			}
			if r.state == stateParked {
				rs.ParkedSince = r.park.since
			}
			if r.idle() {
				rs.IdleSince = r.idleSince
			}
			ps.Replicas = append(ps.Replicas, rs)
		}
		st.Projects = append(st.Projects, ps)
	}
	st.GPUs = s.gpuStatus()
	st.Teams = s.teamStatus()
	return st
}

// queueStatus lists p's first queued calls with their estimates.
func (s *Scheduler) queueStatus(p *project) []QueuedCall {
	now := s.clk.Now()
	calls := p.queue.first(maxStatusQueue, now)
	out := make([]QueuedCall, 0, len(calls))
	for i, c := range calls {
		why, eta := s.explain(c, i, now)
		q := QueuedCall{ID: c.c.ID, QueuePosition: i, WaitingFor: why}
		if eta != nil {
			q.ETAMs, q.ETARangeMs = &eta.ms, &[2]int64{eta.lo, eta.hi}
		}
		out = append(out, q)
	}
	return out
}

// gpuStatus is the hand-outs on each device, from the same bookkeeping that
// placement uses. Releases the driver has shown back since are pruned
// first: with nothing waiting for a GPU no schedule pass would do it, and
// the status would keep an exited replica's hold.
func (s *Scheduler) gpuStatus() []GPUStatus {
	devs := s.devices()
	s.pruneReleases(devs)
	held := s.assignments()
	out := make([]GPUStatus, 0, len(devs))
	for _, d := range devs {
		g := GPUStatus{UUID: d.UUID, ReservedMiB: loadOf(d, held).reservedMiB(d), Replicas: []string{}}
		for _, a := range held {
			if slices.Contains(a.gpus, d.UUID) {
				g.Replicas = append(g.Replicas, a.replica)
			}
		}
		out = append(out, g)
	}
	return out
}
