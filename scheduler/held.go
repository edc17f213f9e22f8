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
// doctor warn of it, and a queued call of it says so (Call.WaitingFor),
// naming the projects whose minimums hold it only to callers who may see
// them all (store.Wait's Named).

// WaitHeldByMinimums is the WaitingFor code of a call whose project can get
// no CPU slot or GPU while other projects' minReplicas hold them.
const WaitHeldByMinimums = "heldByMinimums"

// demand is what one project asks of the box: one replica's request, and
// the replicas it keeps at all times.
type demand struct {
	id   string
	team string
	req  placementRequest
	min  int
}

func demandsOf(projects []store.Project) []demand {
	out := make([]demand, 0, len(projects))
	for _, p := range projects {
		out = append(out, demand{id: p.ID, team: p.TeamID, req: requestOf(p.Model), min: p.MinReplicas})
	}
	return out
}

// demands are the loop's projects as heldByMinimums reads them, with this
// node's minimums (a cluster node's share).
func (s *Scheduler) demands() []demand {
	out := make([]demand, 0, len(s.order))
	for _, p := range s.order {
		if !p.deleted {
			out = append(out, demand{id: p.id, team: p.cfg.TeamID, req: requestOf(p.cfg.Model), min: p.minReplicas()})
		}
	}
	return out
}

// heldByMinimums says why one replica of the project id cannot get a CPU
// slot or GPU while the minReplicas of the other projects in all hold them
// (GPU minimums packed biggest first, as MinimumsWarnings packs them):
// a WaitHeldByMinimums whose Named is e.g. "no CPU slot: the minReplicas of
// projects a, b hold all 2 cpuSlots" and whose Text names none; nil when
// one fits beside them, or when the project does not fit the machine at
// all (its calls fail with that at once).
func heldByMinimums(devices []gpu.Device, cpuSlots int, all []demand, id string) *store.Wait {
	i := slices.IndexFunc(all, func(d demand) bool { return d.id == id })
	if i < 0 {
		return nil
	}
	want := all[i]
	if fitsMachine(devices, want.req) != nil {
		return nil
	}
	var holders []demand
	if want.req.gpus == 0 {
		held := 0
		for _, d := range all {
			if d.id != id && d.req.gpus == 0 && d.min > 0 {
				held += d.min
				holders = append(holders, d)
			}
		}
		if held < cpuSlots {
			return nil
		}
		return heldWait(holders,
			fmt.Sprintf("no CPU slot: other projects' minReplicas hold all %d cpuSlots", cpuSlots),
			"no CPU slot: the minReplicas of projects %s hold all %d cpuSlots", cpuSlots)
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
			if !slices.ContainsFunc(holders, func(h demand) bool { return h.id == d.id }) {
				holders = append(holders, d)
			}
		}
	}
	if _, ok := place(devices, held, want.req); ok || len(holders) == 0 {
		return nil
	}
	return heldWait(holders,
		fmt.Sprintf("no GPU: other projects' minReplicas hold the GPUs its %s would need", want.req),
		"no GPU: the minReplicas of projects %s hold the GPUs its %s would need", want.req)
}

// heldWait is the WaitHeldByMinimums of a project the holders leave
// nothing: text names no project; named, a format whose first verb takes
// the holders' ids (sorted, comma-separated) and the rest args, names them.
func heldWait(holders []demand, text, named string, args ...any) *store.Wait {
	slices.SortFunc(holders, func(a, b demand) int { return strings.Compare(a.id, b.id) })
	ids := make([]string, len(holders))
	names := make([]store.ProjectRef, len(holders))
	for i, h := range holders {
		ids[i], names[i] = h.id, store.ProjectRef{TeamID: h.team, ID: h.id}
	}
	return &store.Wait{Code: WaitHeldByMinimums, Text: text,
		Named: fmt.Sprintf(named, append([]any{strings.Join(ids, ", ")}, args...)...), Names: names}
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
		if why == nil {
			continue
		}
		fix := "lower one of those minReplicas"
		if requestOf(p.Model).gpus == 0 {
			fix += ", or raise cpuSlots"
		}
		out = append(out, fmt.Sprintf("project %s can never run a call: %s, and minimum replicas are never stopped for another project; "+
			"its calls would wait until their inferenceTimeout (%s)", p.ID, why.Named, fix))
	}
	return out
}
