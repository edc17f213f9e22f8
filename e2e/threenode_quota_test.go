//go:build cluster

package e2e

// One cluster, one set of limits (#42): a team's quota holds across the
// three nodes, not on each.

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// runTimes reads when each logged run of the tags began (the echo
// model's run log, "t").
func (c *threeNodes) runTimes(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for _, r := range c.runLines(t) {
		out[r.Inputs.Tag] = r.T
	}
	return out
}

// mostAtOnce is the most of the intervals [start, start+d) that overlap.
func mostAtOnce(starts []float64, d float64) int {
	type edge struct {
		at    float64
		delta int
	}
	var edges []edge
	for _, s := range starts {
		edges = append(edges, edge{s, 1}, edge{s + d, -1})
	}
	slices.SortFunc(edges, func(a, b edge) int {
		switch {
		case a.at < b.at:
			return -1
		case a.at > b.at:
			return 1
		}
		return a.delta - b.delta // an end before a start at the same instant
	})
	most, now := 0, 0
	for _, e := range edges {
		now += e.delta
		most = max(most, now)
	}
	return most
}

// Issue 42, "Done when" 4: a team with a runningCalls quota of 2 and a
// replica of its project on each of three nodes: six calls of 2 s started
// two through each node run at most two at a time across the cluster
// (each node held to its share of the quota, which the leader moves to
// where calls wait), and all six succeed. Per node, as before, three ran
// at once.
func TestThreeNodeClusterHoldsATeamsQuotaAcrossNodes(t *testing.T) {
	echo := echoDir(t)
	mark := marker()
	c := newThreeNodes(t, clusterOpts{})
	n1 := c.nodes[0]
	admin := n1.d.createKey("acme", true)
	key := n1.d.createKey("acme", false)
	if out, err := n1.d.cli("team", "set", "acme", "--running-calls", "2"); err != nil {
		t.Fatalf("team set: %v: %s", err, out)
	}
	n1.d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, mark, "") + "    minReplicas: 3\n    maxReplicas: 3\n")
	c.waitLeader(t, admin, time.Minute, c.nodes[:])
	c.waitReplicas(t, admin, mark, "echo", 2*time.Minute, c.nodes[:], "a replica on each node", func(m map[string]int) bool {
		return m["node-1"] == 1 && m["node-2"] == 1 && m["node-3"] == 1
	})

	const run = 2.0 // seconds each call sleeps in its model
	var ids, tags []string
	for i := range 6 {
		n := c.nodes[i%3]
		tag := fmt.Sprintf("q-%d", i)
		r := n.client(t, key).start("mk-echo", c.logged(tag, fmt.Sprintf(`"sleep":%g`, run)), true)
		id, _ := r["callID"].(string)
		if id == "" {
			t.Fatalf("start through %s: %v", n.name, r)
		}
		ids, tags = append(ids, id), append(tags, tag)
	}
	for i, id := range ids {
		if r := c.nodes[i%3].client(t, key).waitResult(id); r["message"] != "success" {
			t.Errorf("call %s: %v", tags[i], r)
		}
	}
	times := c.runTimes(t)
	var starts []float64
	nodes := map[string]bool{}
	runs := c.runs(t)
	for _, tag := range tags {
		starts = append(starts, times[tag])
		for _, node := range runs[tag] {
			nodes[node] = true
		}
	}
	// A run's interval in the model is inside the call's running time in
	// inferd, so overlapping model runs are calls running at once.
	if most := mostAtOnce(starts, run); most > 2 {
		t.Errorf("%d calls of acme ran at once across the cluster (starts %v); its runningCalls quota is 2", most, starts)
	}
	t.Logf("the six calls ran on %v, at most %d at once", nodes, mostAtOnce(starts, run))
}
