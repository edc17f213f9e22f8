package scheduler

import (
	"slices"

	"inferd/gpu"
)

// assignment is one replica's hold on GPUs.
type assignment struct {
	replica   string
	gpus      []string // UUIDs
	memoryMiB uint64   // per GPU; 0 = the whole GPU
}

// placementRequest is what one replica asks for.
type placementRequest struct {
	gpus      int    // whole GPUs
	memoryMiB uint64 // reserved for sharing a GPU by memory; not used yet
}

// place chooses the GPUs for a replica, given the machine's devices and what
// is already assigned: for now whole GPUs only, the free ones with the lowest
// indexes. It reports false when the request does not fit now. It is a pure
// function so that placement rules can be tested as tables.
func place(devices []gpu.Device, held []assignment, req placementRequest) ([]string, bool) {
	if req.gpus <= 0 {
		return nil, true
	}
	taken := make(map[string]bool, len(held))
	for _, a := range held {
		for _, u := range a.gpus {
			taken[u] = true
		}
	}
	free := make([]gpu.Device, 0, len(devices))
	for _, d := range devices {
		if !taken[d.UUID] {
			free = append(free, d)
		}
	}
	if len(free) < req.gpus {
		return nil, false
	}
	slices.SortFunc(free, func(a, b gpu.Device) int { return a.Index - b.Index })
	out := make([]string, req.gpus)
	for i := range out {
		out[i] = free[i].UUID
	}
	return out, true
}

// assignments lists the GPU holdings of every replica, stopping ones
// included: a GPU is free only once its process has exited.
func (s *Scheduler) assignments() []assignment {
	var held []assignment
	for _, p := range s.order {
		for _, r := range p.replicas {
			if len(r.gpus) > 0 {
				held = append(held, assignment{replica: r.id, gpus: r.gpus, memoryMiB: uint64(p.cfg.Model.GPUMemoryMiB)})
			}
		}
	}
	return held
}
