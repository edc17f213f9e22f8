package cluster

import (
	"math/rand/v2"
	"slices"
	"testing"

	"inferd/store"
)

func TestWaterfillDividesTheQuotaByWhatEachNodeWants(t *testing.T) {
	for _, tc := range []struct {
		name  string
		quota int
		wants []int
		want  []int
	}{
		{"nobody wants: spread evenly", 3, []int{0, 0, 0}, []int{1, 1, 1}},
		{"nobody wants, fewer units than nodes", 2, []int{0, 0, 0}, []int{1, 1, 0}},
		{"one wants everything", 2, []int{0, 5, 0}, []int{0, 2, 0}},
		{"all want more than their part", 4, []int{9, 9, 9}, []int{2, 1, 1}},
		{"a small want is met, the rest shared", 6, []int{1, 9, 9}, []int{1, 3, 2}},
		{"wants met, the rest spread", 6, []int{1, 1, 0}, []int{2, 2, 2}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := waterfill(tc.quota, tc.wants)
			if !slices.Equal(got, tc.want) {
				t.Errorf("waterfill(%d, %v) = %v; want %v", tc.quota, tc.wants, got, tc.want)
			}
		})
	}
}

// simNode is one node of the quota simulation: the share it applies (the
// last record it heard of), what it runs under it, and what it last
// published, which the leader reads late.
type simNode struct {
	applied    int
	appliedRev int64
	use, want  int
	published  TeamLoad
}

// The leader's shares keep what the nodes run within the team's quota at
// every moment, however late the nodes hear of a new share and however
// stale what they published is, and once the wants stay put every want
// within the quota is met: a simulation of random steps (a leader pass,
// a node hearing of the newest record, a node starting or ending calls
// within the share it applies, a node publishing, a want changing).
func TestQuotaSharesNeverLetTheNodesRunMoreThanTheQuota(t *testing.T) {
	const quota = 5
	q := store.Quota{RunningCalls: quota}
	for seed := range uint64(200) {
		r := rand.New(rand.NewPCG(seed, 7))
		nodes := make([]*simNode, 3)
		for i := range nodes {
			nodes[i] = &simNode{}
		}
		var record TeamShares
		var rev int64
		infos := func() []NodeInfo {
			out := make([]NodeInfo, len(nodes))
			for i, n := range nodes {
				out[i] = NodeInfo{Name: string(rune('a' + i)), Lease: 1, Teams: map[string]TeamLoad{"t": n.published}}
			}
			return out
		}
		pass := func() {
			next := shareTeam("t", q, infos(), record, rev)
			if !mapsEqual(next, record.Nodes) {
				rev++
				record = TeamShares{Team: "t", Nodes: next}
			}
		}
		for step := range 400 {
			n := nodes[r.IntN(len(nodes))]
			switch r.IntN(6) {
			case 0:
				pass()
			case 1: // hears of the newest record
				n.applied, n.appliedRev = record.Nodes[string(rune('a'+slices.Index(nodes, n)))].Share.RunningCalls, rev
			case 2: // starts calls within its share
				for n.use < min(n.want, n.applied) && r.IntN(2) == 0 {
					n.use++
				}
			case 3: // calls end
				n.use = max(n.use-r.IntN(3), 0)
			case 4:
				n.published = TeamLoad{Rev: n.appliedRev, Share: store.Quota{RunningCalls: n.applied},
					Use: store.Quota{RunningCalls: n.use}, Want: store.Quota{RunningCalls: n.want}}
			case 5:
				n.want = r.IntN(quota + 2)
			}
			total := 0
			for _, m := range nodes {
				total += m.use
			}
			if total > quota {
				t.Fatalf("seed %d step %d: the nodes run %d calls, over the quota %d", seed, step, total, quota)
			}
		}
		// The wants stay put: after rounds of hearing, running, publishing
		// and passes, each node runs what it wants, within the quota.
		wants := []int{1, 2, 2}
		for i, n := range nodes {
			n.want = wants[i]
		}
		for range 20 {
			for i, n := range nodes {
				n.applied, n.appliedRev = record.Nodes[string(rune('a'+i))].Share.RunningCalls, rev
				n.use = min(n.want, n.applied)
				n.published = TeamLoad{Rev: n.appliedRev, Share: store.Quota{RunningCalls: n.applied},
					Use: store.Quota{RunningCalls: n.use}, Want: store.Quota{RunningCalls: n.want}}
			}
			pass()
		}
		for i, n := range nodes {
			if n.use != wants[i] {
				t.Fatalf("seed %d: after the wants stayed put node %d runs %d; want %d (shares %+v)", seed, i, n.use, wants[i], record.Nodes)
			}
		}
	}
}

func mapsEqual(a, b map[string]TeamShare) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// BenchmarkTeamShare is the lookup the scheduler makes at each admission
// and dispatch check of a team with a quota on a cluster node: the quota
// record from the watch cache, decoded once per revision.
func BenchmarkTeamShare(b *testing.B) {
	n := &Node{o: Options{Name: "a"}, quotas: newCache("/quota/", nil)}
	n.lease.Store(7)
	v := []byte(`{"team":"acme","nodes":{"a":{"lease":7,"share":{"runningCalls":2}},"b":{"lease":9,"share":{"runningCalls":1}}}}`)
	n.quotas.entries["acme"] = entry{value: v, modRev: 3}
	if q, rev := n.TeamShare("acme"); q.RunningCalls != 2 || rev != 3 {
		b.Fatalf("TeamShare = %+v, %d", q, rev)
	}
	b.ReportAllocs()
	for b.Loop() {
		n.TeamShare("acme")
	}
}
