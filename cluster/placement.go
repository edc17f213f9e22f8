package cluster

import (
	"cmp"
	"maps"
	"slices"

	"inferd/store"
)

// The leader's placement rule (docs/cluster.md, "Placement"), a pure
// function of the live nodes as they published themselves, the projects,
// and the placements in force, so that the same inputs always give the
// same answer (the leader re-runs it every few seconds and writes only
// what changed):
//
//  1. Projects are placed one at a time, by id. A project's replicas need
//     the GPUs of its store.ModelSpec.GPUDemand each (gpuMemoryMiB alone
//     is a share of one GPU), each GPU healthy, not held whole by a
//     replica, and with gpuMemoryMiB free (a project without gpuMemoryMiB
//     needs a GPU all free); a CPU project needs a free CPU slot. What a
//     project placed here is taken from the node's free room before the
//     next project is placed, so two projects are not both given the one
//     free GPU.
//  2. Sticky: a live node in the project's placement stays in it. A
//     placement never shrinks while its nodes live (their idle replicas
//     still stop after idleTimeout): dropping a node that looks idle
//     would move shares back and forth as loads come and go.
//  3. The project's minReplicas (for the whole cluster) are given out one
//     at a time: first to a node that already runs a replica of it not
//     yet counted, then to a placed node whose Min in force is not yet
//     given (its replica may still be starting) and that has the room,
//     then to the node with the most room for another one (on a tie: the
//     node given fewer so far, a placed node, by name). So the minimum spreads
//     over the nodes with the most free capacity, and a dead node's share
//     goes to the others.
//  4. Every project is on at least one node (a start needs somewhere to
//     run), the fitting node with the most room, even with minReplicas 0.
//     With no room anywhere (every GPU held, by idle replicas perhaps,
//     which that node's scheduler may stop), the first node by name whose
//     GPUs could hold a replica once free; a CPU project any node.
//  5. Scale-out: when every placed node runs its share's Max (or as many
//     as it can: its ProjectLoad.Max) and calls are queued there, one
//     fitting node is added, while the project's maxReplicas allows.
//  6. The project's maxReplicas is split over its nodes: each node first
//     gets its Min, the rest is dealt one at a time, by name. A node
//     left with Max 0 (more nodes than maxReplicas) leaves the placement.
//
// A project whose Min cannot all be placed where there is room has the
// rest given to its placed nodes all the same (rule 3): the node's
// scheduler starts those replicas when it has room.

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
// nodes, given the placements in force. Projects with no node that fits
// are left out.
func place(projects []store.Project, nodes []NodeInfo, current map[string]Placement) map[string]map[string]Share {
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
		if shares := placeOne(p, names, live, rooms, current[p.ID]); len(shares) > 0 {
			out[p.ID] = shares
		}
	}
	return out
}

// placeOne places project p; it takes what it uses from rooms.
func placeOne(p store.Project, names []string, live map[string]NodeInfo, rooms map[string]*room, cur Placement) map[string]Share {
	maxR := max(p.MaxReplicas, 1)
	placed := map[string]bool{}
	for n := range cur.Nodes {
		if _, ok := live[n]; ok {
			placed[n] = true // rule 2
		}
	}
	running := func(n string) int { return live[n].Projects[p.ID].Replicas }
	mins := map[string]int{}
	// best picks the node with the most room for one more replica among
	// those that have any; on a tie the one given fewer of the minimum so
	// far (the minimum spreads), then a placed one, then by name.
	best := func(skip func(string) bool) string {
		pick, pickUnits := "", 0
		for _, n := range names {
			if skip != nil && skip(n) {
				continue
			}
			u := rooms[n].units(p.Model, maxR)
			if u == 0 {
				continue
			}
			better := pick == "" || u > pickUnits
			if !better && u == pickUnits {
				better = mins[n] < mins[pick] || mins[n] == mins[pick] && placed[n] && !placed[pick]
			}
			if better {
				pick, pickUnits = n, u
			}
		}
		return pick
	}
	// Rule 3: the minimum, one replica at a time.
	short := 0 // replicas of the minimum no node has room for now
	for range min(p.MinReplicas, maxR) {
		n := ""
		for _, m := range names {
			if running(m) > mins[m] {
				n = m // already runs one: no room needed
				break
			}
		}
		for _, m := range names {
			if n == "" && cur.Nodes[m].Min > mins[m] && placed[m] && rooms[m].units(p.Model, 1) > 0 {
				n = m // its share in force, whose replica may not have started yet
				rooms[n].take(p.Model)
			}
		}
		if n == "" {
			if n = best(nil); n == "" {
				short++ // no room anywhere now
				continue
			}
			rooms[n].take(p.Model)
		}
		mins[n]++
		placed[n] = true
	}
	// Rule 4: somewhere to run.
	if len(placed) == 0 {
		if n := best(nil); n != "" {
			rooms[n].take(p.Model)
			placed[n] = true
		} else if n := couldFit(p.Model, names, live); n != "" {
			placed[n] = true
		} else {
			return nil
		}
	}
	// Rule 3, the rest: the part of the minimum with no room goes to the
	// placed nodes all the same, the one given fewest first, so each node
	// starts it when room appears there (its scheduler never runs more
	// than it has room for).
	for ; short > 0 && len(placed) > 0; short-- {
		n := ""
		for _, m := range slices.Sorted(maps.Keys(placed)) {
			if n == "" || mins[m] < mins[n] {
				n = m
			}
		}
		mins[n]++
	}
	// Rule 5: scale-out.
	if len(placed) < maxR && saturated(p.ID, placed, live, cur) {
		if n := best(func(n string) bool { return placed[n] }); n != "" {
			rooms[n].take(p.Model)
			placed[n] = true
		}
	}
	// Rule 6: the maximum, dealt out.
	order := slices.Sorted(maps.Keys(placed))
	shares := map[string]Share{}
	left := maxR
	for _, n := range order {
		shares[n] = Share{Min: mins[n], Max: mins[n]}
		left -= mins[n]
	}
	for i := 0; left > 0; i = (i + 1) % len(order) {
		s := shares[order[i]]
		s.Max++
		shares[order[i]] = s
		left--
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
