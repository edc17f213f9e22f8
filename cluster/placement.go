package cluster

import (
	"cmp"
	"maps"
	"slices"
	"time"

	"inferd/store"
)

// The leader's placement rule (docs/cluster.md, "Placement"), a pure
// function of the live nodes as they published themselves, the projects,
// the placements in force and the time, so that the same inputs always
// give the same answer (the leader re-runs it every few seconds and writes
// only what changed):
//
//  1. Projects are placed one at a time, by id. A project's replicas need
//     the GPUs of its store.ModelSpec.GPUDemand each (gpuMemoryMiB alone
//     is a share of one GPU), each GPU healthy, not held whole by a
//     replica, and with gpuMemoryMiB free (a project without gpuMemoryMiB
//     needs a GPU all free); a CPU project needs a free CPU slot. What a
//     project placed here is taken from the node's free room before the
//     next project is placed, so two projects are not both given the one
//     free GPU.
//  2. Sticky: a live node in the project's placement stays in it while it
//     has a part of the minimum, or runs a replica or a call of the
//     project, or joined the placement less than scaleInAfter ago (a node
//     added for scale-out gets time for the starts sent to it to arrive).
//  3. The project's minReplicas (for the whole cluster) are spread: given
//     out one at a time, each to the node given the fewest so far among
//     those that run a replica of it not yet counted or have room for one;
//     on a tie, one that runs a replica (no boot), then one whose Min in
//     force is not yet given, then the one with the most room, then by
//     name. So one node's death takes as few of them as can be, a dead
//     node's share goes to the others, a node that comes back gets its
//     share again, and a burst's replicas on one node do not draw the
//     minimum there.
//  4. Every project is on at least one node (a start needs somewhere to
//     run), even with minReplicas 0: a placed node it keeps (rule 2), or
//     the fitting node with the most room. With no room anywhere (every
//     GPU held, by idle replicas perhaps, which that node's scheduler may
//     stop), the first node by name whose GPUs could hold a replica once
//     free; a CPU project any node.
//  5. Scale-out: when every placed node runs its share's Max (or as many
//     as it can: its ProjectLoad.Max) and calls are queued there, one
//     fitting node is added, while the project's maxReplicas allows.
//  6. Scale-in: a placed node that rule 2 does not keep leaves the
//     placement (its replicas idled out and no call of the project is
//     there), as long as another node stays.
//  7. The project's maxReplicas is split over its nodes: each node first
//     gets its Min, then what it runs beyond its Min (a burst's replicas
//     run on), as far as maxReplicas goes; the rest is dealt one at a
//     time, each to the node with the lowest Max (then by name). A node
//     left with Max 0 (more nodes than maxReplicas) leaves the placement.
//
// A project whose Min cannot all be placed where there is room has the
// rest given to its placed nodes all the same (rule 3): the node's
// scheduler starts those replicas when it has room.

// scaleInAfter is how long a node added to a placement stays in it
// without a replica or call of the project (rule 2): the starts the
// routers send it reach it and queue there well within it.
const scaleInAfter = 30 * time.Second

// room is what a node can still take while one placement pass runs.
type room struct {
	gpus    []GPUInfo
	cpuFree int
}

func newRoom(c Capacity) *room {
	return &room{gpus: slices.Clone(c.GPUs), cpuFree: max(c.CPUSlots-c.CPUUsed, 0)}
}

// gpuNeed is the free MiB GPU g must have for one replica of a project
// with model m; whole reports that the replica holds the GPU whole. A
// whole GPU must be all free, less the slack the node's scheduler allows
// (scheduler/placement.go, wholeSlackMiB: what the driver reserves or
// shows in use while nobody holds the GPU), which the node does not
// publish: a 32nd of the GPU, at least 512 MiB.
func gpuNeed(g GPUInfo, d store.GPUDemand) (need int64, whole bool) {
	if d.MemoryMiB > 0 {
		return d.MemoryMiB, false
	}
	return g.TotalMiB - min(max(g.TotalMiB/32, 512), g.TotalMiB-1), true
}

// take takes the room of one replica of a project with model m, and
// reports whether there was any. GPUs are chosen in index order.
func (r *room) take(m store.ModelSpec) bool {
	d := m.GPUDemand()
	if d.GPUs == 0 {
		if r.cpuFree <= 0 {
			return false
		}
		r.cpuFree--
		return true
	}
	var picked []int
	for i, g := range r.gpus {
		need, _ := gpuNeed(g, d)
		if g.Healthy && !g.InUse && g.FreeMiB >= need && need > 0 {
			picked = append(picked, i)
			if len(picked) == d.GPUs {
				break
			}
		}
	}
	if len(picked) < d.GPUs {
		return false
	}
	for _, i := range picked {
		need, whole := gpuNeed(r.gpus[i], d)
		r.gpus[i].FreeMiB -= need
		r.gpus[i].InUse = r.gpus[i].InUse || whole
	}
	return true
}

// units is how many more replicas of a project with model m the room holds
// (at most limit).
func (r *room) units(m store.ModelSpec, limit int) int {
	cp := &room{gpus: slices.Clone(r.gpus), cpuFree: r.cpuFree}
	n := 0
	for n < limit && cp.take(m) {
		n++
	}
	return n
}

// place computes every project's placement (rule above) over the live
// nodes at time now, given the placements in force. Projects with no node
// that fits are left out.
func place(projects []store.Project, nodes []NodeInfo, current map[string]Placement, now time.Time) map[string]map[string]Share {
	rooms := map[string]*room{}
	live := map[string]NodeInfo{}
	for _, n := range nodes {
		rooms[n.Name] = newRoom(n.Capacity)
		live[n.Name] = n
	}
	names := slices.Sorted(maps.Keys(live))
	ps := slices.SortedFunc(slices.Values(projects), func(a, b store.Project) int { return cmp.Compare(a.ID, b.ID) })
	out := map[string]map[string]Share{}
	for _, p := range ps {
		pp := projectPlacement{p: p, names: names, live: live, rooms: rooms, cur: current[p.ID], now: now}
		if shares := pp.place(); len(shares) > 0 {
			out[p.ID] = shares
		}
	}
	return out
}

// projectPlacement is one project's placement pass; it takes what the
// project uses from rooms.
type projectPlacement struct {
	p     store.Project
	names []string
	live  map[string]NodeInfo
	rooms map[string]*room
	cur   Placement
	now   time.Time

	placed map[string]bool
	mins   map[string]int
}

// load is the project's load on node n.
func (pp *projectPlacement) load(n string) ProjectLoad { return pp.live[n].Projects[pp.p.ID] }

// uncounted reports whether node n runs a replica of the project that the
// minimum given out so far does not count.
func (pp *projectPlacement) uncounted(n string) bool { return pp.load(n).Replicas > pp.mins[n] }

// best picks the node with the most room for one more replica among those
// that have any; on a tie the one given fewer of the minimum so far, then
// a placed one, then by name.
func (pp *projectPlacement) best(skip func(string) bool) string {
	pick, pickUnits := "", 0
	for _, n := range pp.names {
		if skip != nil && skip(n) {
			continue
		}
		u := pp.rooms[n].units(pp.p.Model, max(pp.p.MaxReplicas, 1))
		if u == 0 {
			continue
		}
		better := pick == "" || u > pickUnits
		if !better && u == pickUnits {
			better = pp.mins[n] < pp.mins[pick] || pp.mins[n] == pp.mins[pick] && pp.placed[n] && !pp.placed[pick]
		}
		if better {
			pick, pickUnits = n, u
		}
	}
	return pick
}

// spreadTo picks the node for the next replica of the minimum (rule 3), ""
// when no node runs one not yet counted or has room for one.
func (pp *projectPlacement) spreadTo() string {
	type cand struct {
		name          string
		given         int
		runs, inForce bool
		units         int
	}
	var pick *cand
	for _, n := range pp.names {
		c := cand{name: n, given: pp.mins[n], runs: pp.uncounted(n),
			inForce: pp.placed[n] && pp.cur.Nodes[n].Min > pp.mins[n]}
		if !c.runs {
			if c.units = pp.rooms[n].units(pp.p.Model, max(pp.p.MaxReplicas, 1)); c.units == 0 {
				continue
			}
		}
		better := pick == nil || cmp.Or(
			cmp.Compare(pick.given, c.given),
			compareTrue(c.runs, pick.runs),
			compareTrue(c.inForce, pick.inForce),
			cmp.Compare(c.units, pick.units),
		) > 0
		if better {
			pick = &c
		}
	}
	if pick == nil {
		return ""
	}
	return pick.name
}

// compareTrue is 1 when only a holds, -1 when only b does, else 0.
func compareTrue(a, b bool) int {
	switch {
	case a && !b:
		return 1
	case b && !a:
		return -1
	}
	return 0
}

// keeps reports whether placed node n stays in the placement though it
// has no part of the minimum (rule 2): something of the project is there,
// or it joined the placement less than scaleInAfter ago.
func (pp *projectPlacement) keeps(n string) bool {
	l := pp.load(n)
	if l.Replicas > 0 || l.Busy > 0 || l.Queued > 0 {
		return true
	}
	joined, ok := pp.cur.Joined[n]
	return ok && pp.now.Sub(joined) < scaleInAfter
}

func (pp *projectPlacement) place() map[string]Share {
	p := pp.p
	maxR := max(p.MaxReplicas, 1)
	pp.placed, pp.mins = map[string]bool{}, map[string]int{}
	for n := range pp.cur.Nodes {
		if _, ok := pp.live[n]; ok {
			pp.placed[n] = true // rule 2, until rule 6 says otherwise
		}
	}
	// Rule 3: the minimum, spread one replica at a time.
	short := 0 // replicas of the minimum no node has room for now
	for range min(p.MinReplicas, maxR) {
		n := pp.spreadTo()
		if n == "" {
			short++ // no room anywhere now
			continue
		}
		if !pp.uncounted(n) {
			pp.rooms[n].take(p.Model)
		}
		pp.mins[n]++
		pp.placed[n] = true
	}
	// Rule 4: somewhere to run.
	if len(pp.placed) == 0 {
		if n := pp.best(nil); n != "" {
			pp.rooms[n].take(p.Model)
			pp.placed[n] = true
		} else if n := couldFit(p.Model, pp.names, pp.live); n != "" {
			pp.placed[n] = true
		} else {
			return nil
		}
	}
	// Rule 3, the rest: the part of the minimum with no room goes to the
	// placed nodes all the same, the one given fewest first, so each node
	// starts it when room appears there (its scheduler never runs more
	// than it has room for).
	for ; short > 0; short-- {
		n := ""
		for _, m := range slices.Sorted(maps.Keys(pp.placed)) {
			if n == "" || pp.mins[m] < pp.mins[n] {
				n = m
			}
		}
		pp.mins[n]++
	}
	// Rule 5: scale-out.
	if len(pp.placed) < maxR && saturated(p.ID, pp.placed, pp.live, pp.cur) {
		if n := pp.best(func(n string) bool { return pp.placed[n] }); n != "" {
			pp.rooms[n].take(p.Model)
			pp.placed[n] = true
		}
	}
	// Rule 6: scale-in, of the nodes placed before this pass; one stays.
	order := slices.Sorted(maps.Keys(pp.placed))
	for _, n := range order {
		_, before := pp.cur.Nodes[n]
		if before && pp.mins[n] == 0 && !pp.keeps(n) && len(pp.placed) > 1 {
			delete(pp.placed, n)
		}
	}
	// Rule 7: the maximum, dealt out.
	order = slices.Sorted(maps.Keys(pp.placed))
	shares := map[string]Share{}
	left := maxR
	for _, n := range order {
		shares[n] = Share{Min: pp.mins[n], Max: pp.mins[n]}
		left -= pp.mins[n]
	}
	for _, n := range order {
		s := shares[n]
		more := min(max(pp.load(n).Replicas-s.Max, 0), max(left, 0))
		s.Max += more
		left -= more
		shares[n] = s
	}
	for ; left > 0; left-- {
		n := order[0]
		for _, m := range order {
			if shares[m].Max < shares[n].Max {
				n = m
			}
		}
		s := shares[n]
		s.Max++
		shares[n] = s
	}
	for n, s := range shares {
		if s.Max == 0 {
			delete(shares, n)
		}
	}
	return shares
}

// saturated reports whether every placed node of project id runs all the
// replicas it may (its Share.Max in force, or its own limit) with calls
// queued on at least one: the project needs another node.
func saturated(id string, placed map[string]bool, live map[string]NodeInfo, cur Placement) bool {
	queued := false
	for n := range placed {
		l := live[n].Projects[id]
		share, ok := cur.Nodes[n]
		full := ok && l.Replicas >= share.Max || l.Max > 0 && l.Replicas >= l.Max
		if !full {
			return false
		}
		queued = queued || l.Queued > 0
	}
	return queued
}

// couldFit returns the first node (by name) that could hold a replica of a
// project with model m once its GPUs were free: enough healthy GPUs large
// enough. Any node could hold a CPU replica.
func couldFit(m store.ModelSpec, names []string, live map[string]NodeInfo) string {
	d := m.GPUDemand()
	for _, n := range names {
		if d.GPUs == 0 {
			return n
		}
		count := 0
		for _, g := range live[n].Capacity.GPUs {
			if g.Healthy && g.TotalMiB >= d.MemoryMiB && g.TotalMiB > 0 {
				count++
			}
		}
		if count >= d.GPUs {
			return n
		}
	}
	return ""
}
