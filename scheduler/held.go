package scheduler

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"inferd/gpu"
	"inferd/store"
)

// A project whose replica can get no CPU slot or GPU while the other
// projects' minReplicas hold them never runs a call: minimum replicas are
// never evicted, so its calls wait until their inferenceTimeout. apply and
// doctor warn of it, and a queued call of it says so (Call.WaitingFor).

// WaitHeldByMinimums is the WaitingFor code of a call whose project can get
// no CPU slot or GPU while other projects' minReplicas hold them.
const WaitHeldByMinimums = "heldByMinimums"

// demand is what one project asks of the box: one replica's request, and
// the replicas it keeps at all times.
type demand struct {
	id  string
	req placementRequest
	min int
}

func demandsOf(projects []store.Project) []demand {
	out := make([]demand, 0, len(projects))
	for _, p := range projects {
		out = append(out, demand{id: p.ID, req: requestOf(p.Model), min: p.MinReplicas})
	}
	return out
}

// demands are the loop's projects as heldByMinimums reads them, with this
// node's minimums (a cluster node's share).
func (s *Scheduler) demands() []demand {
	out := make([]demand, 0, len(s.order))
	for _, p := range s.order {
		if !p.deleted {
			out = append(out, demand{id: p.id, req: requestOf(p.cfg.Model), min: p.minReplicas()})
		}
	}
	return out
}

// heldByMinimums says why one replica of the project id cannot get a CPU
// slot or GPU while the minReplicas of the other projects in all hold them
// (GPU minimums packed biggest first, as MinimumsWarnings packs them), e.g.
// "no CPU slot: the minReplicas of projects a, b hold all 2 cpuSlots"; ""
// when one fits beside them, or when the project does not fit the machine
// at all (its calls fail with that at once).
func heldByMinimums(devices []gpu.Device, cpuSlots int, all []demand, id string) string {
	i := slices.IndexFunc(all, func(d demand) bool { return d.id == id })
	if i < 0 {
		return ""
	}
	want := all[i]
	if fitsMachine(devices, want.req) != nil {
		return ""
	}
	var holders []string
	if want.req.gpus == 0 {
		held := 0
		for _, d := range all {
			if d.id != id && d.req.gpus == 0 && d.min > 0 {
				held += d.min
				holders = append(holders, d.id)
			}
		}
		if held < cpuSlots {
			return ""
		}
		slices.Sort(holders)
		return fmt.Sprintf("no CPU slot: the minReplicas of projects %s hold all %d cpuSlots", strings.Join(holders, ", "), cpuSlots)
	}
	devices = emptied(devices)
	var others []demand
	for _, d := range all {
		if d.id != id && d.req.gpus > 0 {
			for range d.min {
				others = append(others, d)
			}
		}
	}
	slices.SortStableFunc(others, func(a, b demand) int { return biggestFirst(a.req, b.req) })
	var held []assignment
	for _, d := range others {
		if gpus, ok := place(devices, held, d.req); ok {
			held = append(held, assignment{replica: d.id, gpus: gpus, memoryMiB: d.req.memoryMiB})
			if !slices.Contains(holders, d.id) {
				holders = append(holders, d.id)
			}
		}
	}
	if _, ok := place(devices, held, want.req); ok || len(holders) == 0 {
		return ""
	}
	slices.Sort(holders)
	return fmt.Sprintf("no GPU: the minReplicas of projects %s hold the GPUs its %s would need", strings.Join(holders, ", "), want.req)
}

// biggestFirst orders GPU requests for packing: whole GPUs, then more
// GPUs, then more memory.
func biggestFirst(a, b placementRequest) int {
	return cmp.Or(
		cmp.Compare(min(a.memoryMiB, 1), min(b.memoryMiB, 1)),
		cmp.Compare(b.gpus, a.gpus),
		cmp.Compare(b.memoryMiB, a.memoryMiB))
}

// heldWarnings are MinimumsWarnings' lines for the projects without a
// minimum of their own that can get nothing beside the others' minimums
// (a project with one is named in the lines on minimums that do not fit).
func heldWarnings(devices []gpu.Device, cpuSlots int, projects []store.Project) []string {
	all := demandsOf(projects)
	var out []string
	for _, p := range projects {
		if p.MinReplicas > 0 {
			continue
		}
		why := heldByMinimums(devices, cpuSlots, all, p.ID)
		if why == "" {
			continue
		}
		fix := "lower one of those minReplicas"
		if requestOf(p.Model).gpus == 0 {
			fix += ", or raise cpuSlots"
		}
		out = append(out, fmt.Sprintf("project %s can never run a call: %s, and minimum replicas are never stopped for another project; "+
			"its calls would wait until their inferenceTimeout (%s)", p.ID, why, fix))
	}
	return out
}
