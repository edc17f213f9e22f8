package cluster

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
	"inferd/store/etcd"
)

// One cluster, one set of limits: a team's quotas of running calls,
// replicas, GPUs and CPU slots hold across the cluster. The leader leases
// each node a share of each such quota (quota/<team>); a node's scheduler
// holds the team to its share (scheduler.Config.TeamShare), and the shares
// of the live nodes never add up to more than the quota. Nothing is asked
// of etcd on a call's path: a call runs at once on a node with room in its
// share, and a node without waits until the leader moves share to it.
//
// The invariant, kept by the leader alone (shareTeam): for every field,
// the sum over the live nodes of what each may hold is at most the quota.
// What a node may hold is bounded by its ceiling: the most of every share
// written for it since it last confirmed the newest record (a node
// publishes, with its use, the revision of the record its share in force
// came from, both read in one pass of its scheduler's loop,
// NodeInfo.Teams). A node may be slow to hear of a smaller share, and its
// last publication may predate a larger one it applied since: until it
// confirms the newest record, the leader counts the most it was ever
// given. Once it confirms, its ceiling drops to the larger of its share
// and its use, and the rest can go to other nodes. A share is written for
// a node's lease: a node that restarted, or was fenced and rejoined, holds
// none until the leader writes one for its new lease (it counts its use
// meanwhile: a fenced node keeps its replicas). What each node wants (its
// running and queued calls, the replicas its projects want) sets the
// shares; what no node wants is spread over all the nodes, so the first
// call of an idle team runs at once where a share sits.

// QuotaPrefix is the directory of the leader's leases of team quotas.
const QuotaPrefix = "quota/"

// TeamShares is a team's cluster-wide quotas leased to nodes, at
// quota/<team>, written by the leader.
type TeamShares struct {
	Team    string               `json:"team"`
	Nodes   map[string]TeamShare `json:"nodes"`
	Leader  string               `json:"leader"`
	Updated time.Time            `json:"updated"`
}

// TeamShare is one node's share of a team's quotas, good under the lease
// it names only, and the ceiling of what it may still hold (see above).
type TeamShare struct {
	Lease   int64       `json:"lease"`
	Share   store.Quota `json:"share"` // runningCalls, replicas, gpus, cpuSlots
	Ceiling store.Quota `json:"ceiling"`
}

// TeamLoad is a team's state on one node (NodeInfo.Teams), read in one
// pass of the node's scheduler: the share it holds the team to, what the
// team uses, and what it would use if its share allowed.
type TeamLoad struct {
	Rev   int64       `json:"rev"` // the ModRevision of the quota/<team> record Share came from; 0: none
	Share store.Quota `json:"share"`
	Use   store.Quota `json:"use"`
	Want  store.Quota `json:"want"`
}

// wantsMoreShare reports whether a node wants more of a team's quota than
// its share (what it uses included).
func wantsMoreShare(info NodeInfo) bool {
	for _, t := range info.Teams {
		for _, field := range quotaFields {
			if *field(&t.Want) > *field(&t.Share) {
				return true
			}
		}
	}
	return false
}

// leasedQuota says whether a team's quota has a field that the leader
// leases to nodes.
func leasedQuota(q store.Quota) bool {
	return q.RunningCalls > 0 || q.Replicas > 0 || q.GPUs > 0 || q.CPUSlots > 0
}

// quotaFields are the fields leased, as accessors of a store.Quota.
var quotaFields = []func(q *store.Quota) *int{
	func(q *store.Quota) *int { return &q.RunningCalls },
	func(q *store.Quota) *int { return &q.Replicas },
	func(q *store.Quota) *int { return &q.GPUs },
	func(q *store.Quota) *int { return &q.CPUSlots },
}

// TeamShare returns this node's share of team's quotas now, and the
// revision of the record it came from: the one the leader wrote for the
// node's current lease; none (rev 0) while the node holds no lease, or
// none was written for it.
func (n *Node) TeamShare(team string) (store.Quota, int64) {
	lease := n.lease.Load()
	if lease == 0 {
		return store.Quota{}, 0
	}
	e, ok := n.quotas.get(team)
	if !ok {
		return store.Quota{}, 0
	}
	s, ok := n.decodedShare(team, e)
	if ok && s.Lease == lease {
		return s.Share, e.modRev
	}
	return store.Quota{}, 0
}

// decodedShare is this node's entry of team's record e, decoded once per
// revision: the scheduler asks on every admission and dispatch of a team
// with a quota.
func (n *Node) decodedShare(team string, e entry) (TeamShare, bool) {
	n.sharesMu.Lock()
	defer n.sharesMu.Unlock()
	if d, ok := n.shares[team]; ok && d.rev == e.modRev {
		return d.share, d.ok
	}
	var ts TeamShares
	d := decoded{rev: e.modRev}
	if json.Unmarshal(e.value, &ts) == nil {
		d.share, d.ok = ts.Nodes[n.o.Name]
	}
	if n.shares == nil {
		n.shares = map[string]decoded{}
	}
	n.shares[team] = d
	return d.share, d.ok
}

// decoded is this node's entry of a quota/<team> record at a revision.
type decoded struct {
	rev   int64
	share TeamShare
	ok    bool
}

// shareQuotas is the leader's pass over the teams' quotas: every team with
// a leased quota gets shares for the live nodes (shareTeam), written when
// they changed; a team with none left loses its record. The current
// shares are read from etcd, not the watch cache, which may not hold the
// leader's own last write yet.
func (n *Node) shareQuotas(ctx context.Context, f etcd.Fence) error {
	teams, err := n.o.Store.ListTeams()
	if err != nil {
		return fmt.Errorf("list teams: %w", err)
	}
	rctx, cancel := context.WithTimeout(ctx, requestTimeout)
	resp, err := n.o.Client.Get(rctx, n.o.Prefix+QuotaPrefix, clientv3.WithPrefix())
	cancel()
	if err != nil {
		return fmt.Errorf("read the quota shares: etcd: %w", err)
	}
	cur := map[string]TeamShares{}
	revs := map[string]int64{}
	for _, kv := range resp.Kvs {
		var ts TeamShares
		if json.Unmarshal(kv.Value, &ts) == nil && ts.Team != "" {
			cur[ts.Team], revs[ts.Team] = ts, kv.ModRevision
		}
	}
	nodes := n.Nodes()
	now := n.o.Now().UTC()
	seen := map[string]bool{}
	for _, t := range teams {
		if !leasedQuota(t.Quota) {
			continue
		}
		seen[t.ID] = true
		want := shareTeam(t.ID, t.Quota, nodes, cur[t.ID], revs[t.ID])
		if maps.Equal(want, cur[t.ID].Nodes) {
			continue
		}
		v, err := json.Marshal(TeamShares{Team: t.ID, Nodes: want, Leader: n.o.Name, Updated: now})
		if err != nil {
			return fmt.Errorf("encode the quota shares of team %s: %w", t.ID, err)
		}
		if err := n.fenced(ctx, f, clientv3.OpPut(n.o.Prefix+QuotaPrefix+t.ID, string(v))); err != nil {
			return fmt.Errorf("share the quotas of team %s: %w", t.ID, err)
		}
	}
	for team := range cur {
		if !seen[team] {
			if err := n.fenced(ctx, f, clientv3.OpDelete(n.o.Prefix+QuotaPrefix+team)); err != nil {
				return fmt.Errorf("drop the quota shares of team %s: %w", team, err)
			}
		}
	}
	return nil
}

// shareTeam is the shares of team's quota q for the live nodes, given
// their published loads and the record in force (cur, at revision rev).
// Per field: each node's target is its part of the quota by what it wants
// (waterfill); a node over its target shrinks to it at once (its ceiling
// stays until it confirms), and a node under it grows only by what the
// ceilings of all the nodes leave of the quota.
func shareTeam(team string, q store.Quota, nodes []NodeInfo, cur TeamShares, rev int64) map[string]TeamShare {
	out := map[string]TeamShare{}
	for _, info := range nodes {
		out[info.Name] = TeamShare{Lease: info.Lease}
	}
	for _, field := range quotaFields {
		quota := *field(&q)
		if quota == 0 {
			continue
		}
		k := len(nodes)
		next, ceiling, wants := make([]int, k), make([]int, k), make([]int, k)
		for i, info := range nodes {
			load := info.Teams[team]
			use := *field(&load.Use)
			if s, ok := cur.Nodes[info.Name]; ok && s.Lease == info.Lease {
				next[i] = *field(&s.Share)
				ceiling[i] = max(*field(&s.Ceiling), next[i])
				if rev != 0 && load.Rev == rev {
					// It holds the team to the newest record: to its share.
					ceiling[i] = next[i]
				}
			}
			ceiling[i] = max(ceiling[i], use, *field(&load.Share))
			wants[i] = *field(&load.Want)
		}
		target := waterfill(quota, wants)
		free := quota
		for i := range nodes {
			next[i] = min(next[i], target[i])
			free -= ceiling[i]
		}
		for i := range nodes {
			// Up to its own ceiling a node grows for nothing: it is
			// counted already. Beyond, by what is free.
			next[i] = max(next[i], min(target[i], ceiling[i]))
			if grow := min(target[i]-next[i], free); grow > 0 {
				next[i] += grow
				ceiling[i] += grow
				free -= grow
			}
		}
		for i, info := range nodes {
			s := out[info.Name]
			*field(&s.Share), *field(&s.Ceiling) = next[i], ceiling[i]
			out[info.Name] = s
		}
	}
	return out
}

// waterfill divides quota among nodes by what each wants: every node gets
// the same level, capped by its want, the highest level the quota covers
// (units left below the next level go to the first nodes by order). What
// is left once every want is met is spread the same way over all nodes,
// the least holding first, so that an idle team's quota sits everywhere.
func waterfill(quota int, wants []int) []int {
	out := make([]int, len(wants))
	if len(wants) == 0 {
		return out
	}
	total := 0
	for _, w := range wants {
		total += min(w, quota)
	}
	if total >= quota {
		level(out, quota, func(i, l int) int { return min(wants[i], l) })
		return out
	}
	copy(out, wants)
	floors := slices.Clone(out)
	level(out, quota, func(i, l int) int { return max(floors[i], l) })
	return out
}

// level sets out[i] = at(i, L) for the highest L whose sum is at most
// quota, then gives the units left one each to the first nodes that the
// next level would raise.
func level(out []int, quota int, at func(i, l int) int) {
	sum := func(l int) int {
		n := 0
		for i := range out {
			n += at(i, l)
		}
		return n
	}
	lo, hi := 0, quota // sum(lo) <= quota
	for lo < hi {
		mid := lo + (hi-lo+1)/2
		if sum(mid) <= quota {
			lo = mid
		} else {
			hi = mid - 1
		}
	}
	left := quota - sum(lo)
	for i := range out {
		out[i] = at(i, lo)
		if left > 0 && at(i, lo+1) > out[i] {
			out[i]++
			left--
		}
	}
}
