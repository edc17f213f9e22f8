package scheduler

import (
	"slices"
	"time"
)

// Status is the scheduler's state at one moment, for the status page and
// metrics. It holds no call inputs or outputs.
type Status struct {
	Projects     []ProjectStatus `json:"projects"` // sorted by id
	CPUSlots     int             `json:"cpuSlots"`
	CPUSlotsUsed int             `json:"cpuSlotsUsed"`
}

// ProjectStatus is one project's queue and replicas.
type ProjectStatus struct {
	ID          string          `json:"id"`
	TeamID      string          `json:"teamId"`
	MinReplicas int             `json:"minReplicas"`
	MaxReplicas int             `json:"maxReplicas"`
	Queued      int             `json:"queued"`
	Running     int             `json:"running"`
	Waiting     string          `json:"waiting"`   // "", "waiting for CPU slot" or "waiting for GPU"
	LastError   string          `json:"lastError"` // the last failed boot or crash
	Replicas    []ReplicaStatus `json:"replicas"`  // in start order
}

// ReplicaStatus is one replica.
type ReplicaStatus struct {
	ID         string    `json:"id"`
	State      string    `json:"state"` // booting, ready, busy or stopping
	Pid        int       `json:"pid"`
	GPUs       []string  `json:"gpus"`
	Started    time.Time `json:"started"`
	InFlight   int       `json:"inFlight"`
	IdleSince  time.Time `json:"idleSince,omitzero"`  // set while ready with no call
	IdleExpiry time.Time `json:"idleExpiry,omitzero"` // when the idle timeout stops it, if armed
}

func (s *Scheduler) snapshot() Status {
	st := Status{CPUSlots: s.cfg.CPUSlots, CPUSlotsUsed: s.cpuUsed}
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
			Waiting:     p.waiting,
			LastError:   p.lastError,
			Replicas:    make([]ReplicaStatus, 0, len(p.replicas)),
		}
		for _, r := range p.replicas {
			rs := ReplicaStatus{
				ID:         r.id,
				State:      r.stateName(),
				Pid:        r.pid,
				GPUs:       slices.Clone(r.gpus),
				Started:    r.started,
				InFlight:   len(r.calls),
				IdleExpiry: r.idleT.at,
			}
			if r.idle() {
				rs.IdleSince = r.idleSince
			}
			ps.Replicas = append(ps.Replicas, rs)
		}
		st.Projects = append(st.Projects, ps)
	}
	return st
}
