//go:build cluster

package e2e

// The cluster heals by itself (#42): losing quorum is a state a node
// waits out, never a reason to exit, and after a heal every node answers
// every call alike.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
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
// again once the network is back, nothing restarted. The calls each node
// held when the partition began (their project retrying once) end, each
// answered alike by every node within 30 s of the heal: every node was
// fenced, and the leader hands on the calls each abandoned.
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

	// Calls running or queued on every node when the partition begins,
	// and their project with a retry: after the heal each must end, and
	// every node answer it alike.
	n1.d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, mark, "") + "    minReplicas: 3\n    maxReplicas: 3\n    retries: 1\n")
	var ids []string
	for _, n := range c.nodes {
		for i := range 2 {
			r := n.client(t, key).start("mk-echo", c.logged(fmt.Sprintf("%s-%d", n.name, i), `"sleep":2`), true)
			id, _ := r["callID"].(string)
			if id == "" {
				t.Fatalf("start through %s: %v", n.name, r)
			}
			ids = append(ids, id)
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
	c.answerAlike(t, key, ids, 30*time.Second)
	t.Logf("every node answered the calls of before the partition alike %s after the heal", time.Since(healed).Round(time.Millisecond))
	for _, n := range c.nodes {
		n.alive(t, "after the heal")
		n.d.logs.waitForAll(t, time.Minute, recoveredLine, `"job":"expire calls"`)
	}
}

// answerAlike waits up to within (stretched on a busy machine) for every
// node to answer a check of each call with the same final answer (message
// and outputs); the log shows what each node answered whenever that
// changed, so a failure ends with how they still differed.
func (c *threeNodes) answerAlike(t *testing.T, key string, ids []string, within time.Duration) {
	t.Helper()
	var logged string
	testenv.Eventually(t, within, "every node to answer every call of before the partition alike and finally", func() bool {
		differ := c.answersDiffer(key, ids)
		if now := strings.Join(differ, "\n"); now != logged && now != "" {
			t.Logf("the nodes answer differently or not finally:\n%s", now)
			logged = now
		}
		return len(differ) == 0
	})
}

// answersDiffer checks each call on every node and says where an answer is
// not final or not the same as another node's.
func (c *threeNodes) answersDiffer(key string, ids []string) (differ []string) {
	for _, id := range ids {
		var first string
		for _, n := range c.nodes {
			_, r, err := tryDo("POST", n.base+"/check/v4/", nil, fmt.Sprintf(`{"apiKey":%q,"callID":%q}`, key, id))
			msg, _ := r["message"].(string)
			out, _ := json.Marshal(r["modelOutputs"])
			got := fmt.Sprintf("%s %s", msg, out)
			if err != nil {
				got = err.Error()
			}
			if msg != "success" && !strings.HasPrefix(msg, "error") {
				differ = append(differ, fmt.Sprintf("%s on %s: not final: %s", id, n.name, got))
			} else if first == "" {
				first = got
			} else if got != first {
				differ = append(differ, fmt.Sprintf("%s: %s answers %s; another node %s", id, n.name, got, first))
			}
		}
	}
	return differ
}

// Issue 42, "Done when" 2: a follower cut off while a call of a retrying
// project runs on it, whose model answers right after the cut: its write
// of the result finds no quorum, and it keeps the call failed ("the
// result could not be saved") while the leader has it run again
// elsewhere. After the heal every node answers every call alike within
// 30 s: the committed success, never the cut-off node's failure.
func TestThreeNodeClusterAnswersAlikeAfterHeal(t *testing.T) {
	c, _, key, victim := retryingOnEachNode(t, "work")

	// A call held in its model until the test releases it, running on
	// the victim, and three queued behind it there.
	release := filepath.Join(t.TempDir(), "release")
	var ids []string
	start := func(tag, more string) {
		r := victim.client(t, key).start("mk-work", c.logged(tag, more), true)
		id, _ := r["callID"].(string)
		if id == "" {
			t.Fatalf("start through %s: %v", victim.name, r)
		}
		ids = append(ids, id)
	}
	start("late", fmt.Sprintf(`"holdOnce":%q`, release))
	if on := c.waitRun(t, "late", time.Minute); on != victim.name {
		t.Fatalf("a start through %s, where work is placed, ran on %s", victim.name, on)
	}
	for i := range 3 {
		start(fmt.Sprintf("queued-%d", i), "")
	}

	victim.cut(t)
	// The model answers at once, before the victim's lease lapses: its
	// write of the result is in flight when the victim is fenced, and
	// fails once the store's retries give up.
	if err := os.WriteFile(release, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	victim.d.logs.waitFor(t, "saving a call result failed", time.Minute)
	for _, n := range c.others(victim.name) {
		res := n.client(t, key).waitResult(ids[0])
		if res["message"] != "success" {
			t.Fatalf("the cut-off node's held call through %s: %v; want success from a re-run", n.name, res)
		}
	}

	victim.heal(t)
	c.answerAlike(t, key, ids, 30*time.Second)
	victim.alive(t, "after the heal")
}
