//go:build cluster

package e2e

// The cluster heals by itself (#42): losing quorum is a state a node
// waits out, never a reason to exit, and after a heal every node answers
// every call alike.

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// healExtra makes every periodic job of the nodes tick every 2 s, so that
// a partition of some seconds outlasts each of their intervals.
const healExtra = "sweepInterval: 2s\nusage:\n  flushInterval: 2s\n"

// outageLine is what a node logs once when a periodic job first finds etcd
// unavailable (store.Outages), and recoveredLine when it answers again.
const (
	outageLine    = "store unavailable (no quorum?)"
	recoveredLine = "store available again"
)

// alive fails the test when the node's daemon has exited.
func (n *clusterNode) alive(t *testing.T, while string) {
	t.Helper()
	select {
	case <-n.d.exited:
		t.Errorf("%s: %s's daemon exited by itself; log:\n%s", while, n.name, n.d.logs.String())
	default:
	}
}

// Issue 42, "Done when" 1: all three nodes cut off from each other (no
// quorum anywhere) for longer than every sweep interval: each keeps
// running, answers `cluster unavailable; retry` meanwhile, and serves
// again once the network is back, nothing restarted.
func TestThreeNodeClusterResumesAfterFullPartition(t *testing.T) {
	echo := echoDir(t)
	mark := marker()
	c := newThreeNodes(t, clusterOpts{isolated: true, extra: healExtra})
	n1 := c.nodes[0]
	admin := n1.d.createKey("acme", true)
	key := n1.d.createKey("acme", false)
	n1.d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, mark, "") + "    minReplicas: 3\n    maxReplicas: 3\n")
	c.waitLeader(t, admin, time.Minute, c.nodes[:])
	c.waitReplicas(t, admin, mark, "echo", 2*time.Minute, c.nodes[:], "a replica on each node", func(m map[string]int) bool {
		return m["node-1"] == 1 && m["node-2"] == 1 && m["node-3"] == 1
	})
	for _, n := range c.nodes {
		if r := n.client(t, key).start("mk-echo", `{}`, false); r["message"] != "success" {
			t.Fatalf("a call through %s before the partition: %v", n.name, r)
		}
	}

	for _, n := range c.nodes {
		n.cut(t)
	}
	cut := time.Now()
	// Every node's sweeps have found etcd gone (the first try of each job
	// logs the outage) and its lease has lapsed: the partition outlasts
	// every periodic job's interval and the lease.
	for _, n := range c.nodes {
		for _, job := range []string{`"job":"expire calls"`, `"job":"expire usage"`} {
			n.d.logs.waitForAll(t, 2*time.Minute, outageLine, job)
		}
		n.d.logs.waitFor(t, "cluster lease lapsed", 2*time.Minute)
	}
	t.Logf("every node saw its sweeps fail and its lease lapse %s after the cut", time.Since(cut).Round(time.Millisecond))
	for _, n := range c.nodes {
		n.alive(t, "partitioned")
		began := time.Now()
		status, r, err := tryDo("POST", n.base+"/start/v4", nil, fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","modelInputs":{}}`, key))
		msg, _ := r["message"].(string)
		if err != nil || status != http.StatusServiceUnavailable || !strings.HasPrefix(msg, "error: cluster unavailable") {
			t.Errorf("a start through %s while partitioned: HTTP %d %v %v; want 503 `cluster unavailable; retry`", n.name, status, r, err)
		}
		if took := time.Since(began); took > 3*time.Second {
			t.Errorf("a start through %s while partitioned took %s; want the 503 within a try of each read once the outage is known", n.name, took)
		}
	}

	for _, n := range c.nodes {
		n.heal(t)
	}
	healed := time.Now()
	for _, n := range c.nodes {
		eventually(t, 2*time.Minute, "a call through "+n.name+" succeeding after the heal", func() bool {
			r, _ := n.client(t, key).tryStart("mk-echo", `{}`, false)
			return r["message"] == "success"
		})
	}
	t.Logf("every node served again %s after the heal", time.Since(healed).Round(time.Millisecond))
	for _, n := range c.nodes {
		n.alive(t, "after the heal")
		n.d.logs.waitForAll(t, time.Minute, recoveredLine, `"job":"expire calls"`)
	}
}
