//go:build cluster

package e2e

// The failure scenarios of cluster mode (#22, "Done when" 2 to 6) on three
// real nodes. They take a few minutes (leases of 5 s lapse, nodes restart),
// so they build only with the cluster tag: make test-cluster.

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// maxPause is the longest a call through a surviving node may take while
// another node dies: under the lease (5 s) with room for a loaded 2-core CI
// box, so the rule it guards is "calls do not wait out the dead node's lease
// or a whole etcd request timeout" (before the store's retries a killed
// leader paused calls 5.6 s). How long the pause really is, is a figure,
// not a rule: the prototype measured 60 ms for an ordinary node and 1.05 s
// for the leader (research/scaleout.md), docs/cluster.md has this build's,
// and the test logs each run's.
const maxPause = 4 * time.Second

// lateWriteWindow is how long after a late answer a node's write of it may
// still land: the store retries a call write that etcd does not take for
// RetryFor (15 s), each try bounded by the request timeout (5 s).
const lateWriteWindow = 20 * time.Second

// leaseTTL is cluster.LeaseTTL: how long a dead or cut-off node keeps its
// key, so the bound on what waits for a lapsed lease.
const leaseTTL = 5 * time.Second

// failoverCluster is three nodes with two echo projects, each with one
// minimum replica per node: "steady" takes a trickle of short calls whose
// latency is measured, "work" takes calls of a second that are running
// when a node dies, retried workRetries times.
type failoverCluster struct {
	*threeNodes
	mark, admin, key string
}

func newFailoverCluster(t *testing.T, workRetries int) *failoverCluster {
	echo := echoDir(t)
	f := &failoverCluster{threeNodes: newThreeNodes(t, clusterOpts{}), mark: marker()}
	n1 := f.nodes[0]
	f.admin = n1.d.createKey("acme", true)
	f.key = n1.d.createKey("acme", false)
	n1.d.apply("projects:\n" +
		echoProject("steady", "acme", "mk-steady", echo, f.mark, "") + "    minReplicas: 3\n    maxReplicas: 3\n    retries: 1\n" +
		echoProject("work", "acme", "mk-work", echo, f.mark, "") + fmt.Sprintf("    minReplicas: 3\n    maxReplicas: 3\n    retries: %d\n", workRetries))
	f.waitLeader(t, f.admin, time.Minute, f.nodes[:])
	for _, p := range []string{"steady", "work"} {
		f.waitReplicas(t, f.admin, f.mark, p, 2*time.Minute, f.nodes[:], "the minimum replicas, one on each node", func(m map[string]int) bool {
			return m["node-1"] == 1 && m["node-2"] == 1 && m["node-3"] == 1
		})
	}
	return f
}

// trickle sends one short call at a time through each of nodes until stop
// is closed, and reports the slowest and every failure.
type trickle struct {
	stop     chan struct{}
	stopOnce sync.Once
	mu       sync.Mutex
	slowest  time.Duration
	slowOn   string
	calls    int
	failures []string
	wg       sync.WaitGroup
}

func (f *failoverCluster) startTrickle(t *testing.T, nodes []*clusterNode) *trickle {
	tr := &trickle{stop: make(chan struct{})}
	// A test that ends early stops its trickle too.
	t.Cleanup(func() { tr.end(); tr.wg.Wait() })
	for _, n := range nodes {
		c := inferenceClient{base: n.base, key: f.key}
		tr.wg.Go(func() {
			for {
				select {
				case <-tr.stop:
					return
				default:
				}
				began := time.Now()
				r, err := c.tryStart("mk-steady", `{}`, false)
				took := time.Since(began)
				tr.mu.Lock()
				tr.calls++
				if took > tr.slowest {
					tr.slowest, tr.slowOn = took, n.name
				}
				if err != nil || r["message"] != "success" {
					tr.failures = append(tr.failures, fmt.Sprintf("%s: %v %v", n.name, r, err))
				}
				tr.mu.Unlock()
			}
		})
	}
	return tr
}

func (tr *trickle) end() { tr.stopOnce.Do(func() { close(tr.stop) }) }

// checkAt stops the trickle at until, then asserts that no trickled call
// failed or took more than maxPause.
func (tr *trickle) checkAt(t *testing.T, until time.Time, while string) {
	t.Helper()
	// The window is the measurement (a load test's length), not a wait for
	// an event.
	select {
	case <-time.After(time.Until(until)):
	case <-t.Context().Done():
	}
	tr.end()
	tr.wg.Wait()
	t.Logf("%s: %d calls through the survivors, the slowest %s (on %s)", while, tr.calls, tr.slowest, tr.slowOn)
	if tr.slowest > maxPause {
		t.Errorf("%s: a call through %s took %s, more than %s", while, tr.slowOn, tr.slowest, maxPause)
	}
	if len(tr.failures) > 0 {
		t.Errorf("%s: %d of %d calls through the survivors failed: %v", while, len(tr.failures), tr.calls, tr.failures)
	}
}

// handedOut is one call the cluster gave a callID for.
type handedOut struct{ id, tag, via string }

// startWork starts n work calls of a second, startOnly, round robin
// through nodes, each logging its runs under a tag of its own. A start
// that fails through a node that is about to be killed is no callID handed
// out; through any other node it is an error.
func (f *failoverCluster) startWork(t *testing.T, prefix string, n int, nodes []*clusterNode, mayFail string) []handedOut {
	t.Helper()
	var out []handedOut
	for i := 0; i < n; i++ {
		node := nodes[i%len(nodes)]
		tag := fmt.Sprintf("%s-%d", prefix, i)
		r, err := node.client(t, f.key).tryStart("mk-work", f.logged(tag, `"sleep":1`), true)
		id, _ := r["callID"].(string)
		if err != nil || id == "" {
			if node.name != mayFail {
				t.Errorf("start through %s: %v %v", node.name, r, err)
			}
			continue
		}
		out = append(out, handedOut{id: id, tag: tag, via: node.name})
	}
	return out
}

// killUnderLoad starts the trickle through the nodes other than victim and
// 18 work calls through all three, kills victim (kill -9) once a work call
// runs on it, and starts 12 more through the others at once. It returns
// the calls handed out, the trickle, and when the kill was.
func (f *failoverCluster) killUnderLoad(t *testing.T, victim *clusterNode) ([]handedOut, *trickle, time.Time) {
	t.Helper()
	survivors := f.others(victim.name)
	tr := f.startTrickle(t, survivors)
	calls := f.startWork(t, "before", 18, f.nodes[:], victim.name)
	eventually(t, time.Minute, "a work call running on "+victim.name, func() bool {
		for _, r := range f.runs(t) {
			if len(r) > 0 && r[0] == victim.name {
				return true
			}
		}
		return false
	})
	victim.d.kill()
	killed := time.Now()
	return append(calls, f.startWork(t, "after", 12, survivors, "")...), tr, killed
}

// waitFinal long-polls each call through the given nodes until it ends and
// checks it ended in success with its own output, or in the clear error of
// a lost node; it returns the tags of the calls that failed that way.
func (f *failoverCluster) waitFinal(t *testing.T, calls []handedOut, through []*clusterNode, lost string) (failed map[string]bool) {
	failed = map[string]bool{}
	t.Helper()
	deadline := time.Now().Add(3 * time.Minute)
	for i, call := range calls {
		c := through[i%len(through)].client(t, f.key)
		var r map[string]any
		for {
			r = c.check(call.id, true)
			msg, _ := r["message"].(string)
			if msg == "success" || strings.HasPrefix(msg, "error") {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("call %s (%s, started through %s) still %q", call.id, call.tag, call.via, msg)
				break
			}
		}
		switch msg := r["message"]; {
		case msg == "success":
			if out, err := outputOf(r); err != nil || out["echo"].(map[string]any)["tag"] != call.tag {
				t.Errorf("call %s (%s) succeeded with another call's output or none: %v", call.id, call.tag, r)
			}
		case msg == "error: node "+lost+" was lost":
			failed[call.tag] = true
		default:
			t.Errorf("call %s (%s, started through %s) ended %q; want success or %q", call.id, call.tag, call.via, msg, "error: node "+lost+" was lost")
		}
	}
	return failed
}

// checkRuns counts the runs of each call: once, or twice when the first
// run was on the node that died and the second elsewhere. Those are the
// at-least-once cases: a call running on a lost node is run again when
// its retries allow; and whatever its retries, a call the dead node had
// just given its model, before its write of the running state committed
// (the scheduler writes it beside the dispatch, not before), is still
// queued in etcd and is handed on as such. A call that failed with the
// lost node ran there once (a queued one is handed on, not failed). It
// returns how many ran twice.
func (f *failoverCluster) checkRuns(t *testing.T, calls []handedOut, dead string, lost map[string]bool) (twice int) {
	t.Helper()
	runs := f.runs(t)
	for _, call := range calls {
		r := runs[call.tag]
		switch {
		case lost[call.tag] && (len(r) != 1 || r[0] != dead):
			t.Errorf("call %s (%s) failed with the lost node %s but ran on %v; only a call running there may fail so", call.id, call.tag, dead, r)
		case len(r) == 1:
		case len(r) == 2 && r[0] == dead && r[1] != dead:
			twice++
		default:
			t.Errorf("call %s (%s) ran on %v; want once, or once on %s and once after it died", call.id, call.tag, r, dead)
		}
	}
	return twice
}

// Issue 22, "Done when" 2: kill -9 of a node that is not the leader while
// calls run on it, their project without retries. Every callID the
// cluster handed out ends in success or, if it was running on the dead
// node, `error: node NAME was lost`; none runs twice beyond the
// at-least-once cases (checkRuns); calls through the
// other nodes never wait out its lease (maxPause); the dead node's
// minimum replicas come back on the others.
func TestThreeNodeClusterSurvivesKilledNode(t *testing.T) {
	f := newFailoverCluster(t, 0)
	leader := f.waitLeader(t, f.admin, time.Minute, f.nodes[:])
	victim := f.others(leader)[0]
	survivors := f.others(victim.name)

	calls, tr, killed := f.killUnderLoad(t, victim)
	// The trickle runs past the lapse of the dead node's lease and the
	// leader's handover of its calls.
	tr.checkAt(t, killed.Add(leaseTTL+10*time.Second), "while "+victim.name+" died")

	lost := f.waitFinal(t, calls, survivors, victim.name)
	twice := f.checkRuns(t, calls, victim.name, lost)
	t.Logf("%d calls handed out: %d ended `error: node %s was lost`, %d ran twice (at-least-once)", len(calls), len(lost), victim.name, twice)

	t.Run("the dead node's minimum replicas come back on the others", func(t *testing.T) {
		for _, p := range []string{"steady", "work"} {
			f.waitReplicas(t, f.admin, f.mark, p, 2*time.Minute, survivors, "three replicas on the two survivors", func(m map[string]int) bool {
				return m[victim.name] == 0 && m[survivors[0].name]+m[survivors[1].name] == 3
			})
		}
	})
}

// Issue 22, "Done when" 3: kill -9 of the leader (its etcd member too). A
// new leader within a few seconds, every callID final, none lost, none run
// twice beyond the at-least-once case: a call running on the dead node is
// run again elsewhere.
func TestThreeNodeClusterSurvivesKilledLeader(t *testing.T) {
	f := newFailoverCluster(t, 1)
	old := f.node(f.waitLeader(t, f.admin, time.Minute, f.nodes[:]))
	survivors := f.others(old.name)
	// The worst case, as in the prototype: the node killed also leads
	// etcd's raft, so the survivors' etcd elects a leader too.
	f.makeRaftLeader(t, old)

	calls, tr, killed := f.killUnderLoad(t, old)

	// The prototype saw the new leader 7.15 s after the kill (a 5 s lease;
	// etcd renews leases at its own leader change, so the old leader's key
	// may outlive one TTL); three leases are "a few seconds" with room for
	// a loaded 2-core box (11.4 s was seen with eight builds beside it).
	leader := f.waitLeader(t, f.admin, 3*leaseTTL+5*time.Second, survivors, old.name)
	t.Logf("new leader %s, %s after the kill of %s", leader, time.Since(killed).Round(10*time.Millisecond), old.name)
	if took := time.Since(killed); took > 3*leaseTTL {
		t.Errorf("a new leader took %s after the leader's kill, want at most %s", took, 3*leaseTTL)
	}
	tr.checkAt(t, killed.Add(leaseTTL+10*time.Second), "while the leader "+old.name+" died")

	lost := f.waitFinal(t, calls, survivors, old.name)
	twice := f.checkRuns(t, calls, old.name, lost)
	t.Logf("%d calls handed out: %d ended `error: node %s was lost`, %d ran twice (at-least-once)", len(calls), len(lost), old.name, twice)
	if len(lost) > 0 {
		t.Errorf("%d calls failed with the lost leader although their retries allowed a re-run: %v", len(lost), lost)
	}
}

// retryingOnEachNode starts three nodes whose cluster links the test can
// cut, with team acme's project id (model key "mk-"+id, an echo model whose
// calls may run once more) holding a replica on every node. It returns the
// cluster, acme's admin and plain keys, and a follower to cut off.
func retryingOnEachNode(t *testing.T, id string) (c *threeNodes, admin, key string, follower *clusterNode) {
	t.Helper()
	mark := marker()
	c = newThreeNodes(t, clusterOpts{isolated: true})
	n1 := c.nodes[0]
	admin = n1.d.createKey("acme", true)
	key = n1.d.createKey("acme", false)
	n1.d.apply("projects:\n" + echoProject(id, "acme", "mk-"+id, echoDir(t), mark, "") +
		"    minReplicas: 3\n    maxReplicas: 3\n    retries: 1\n")
	leader := c.waitLeader(t, admin, time.Minute, c.nodes[:])
	c.waitReplicas(t, admin, mark, id, 2*time.Minute, c.nodes[:], "a replica on each node", func(m map[string]int) bool {
		return m["node-1"] == 1 && m["node-2"] == 1 && m["node-3"] == 1
	})
	return c, admin, key, c.others(leader)[0]
}

// Issue 22, "Done when" 4: a node cut off from the other two (its cluster
// link down; the process runs on) is fenced: the others drop it once its
// lease lapses, its running call is run again elsewhere, and it takes no
// new work. After the link is back, the result its model gives late is
// discarded (the re-run's stays), and it rejoins and takes calls again.
func TestThreeNodeClusterFencesCutOffNode(t *testing.T) {
	c, admin, key, victim := retryingOnEachNode(t, "slow")
	others := c.others(victim.name)

	// A call whose first run holds until the test releases it: it starts
	// on the victim (placed there, so it runs there) and is running when
	// the link goes down.
	release := filepath.Join(t.TempDir(), "release")
	r := victim.client(t, key).start("mk-slow", c.logged("late", fmt.Sprintf(`"holdOnce":%q`, release)), true)
	id, _ := r["callID"].(string)
	if id == "" {
		t.Fatalf("start on %s: %v", victim.name, r)
	}
	if on := c.waitRun(t, "late", time.Minute); on != victim.name {
		t.Fatalf("a start through %s, where slow is placed, ran on %s", victim.name, on)
	}
	victim.cut(t)
	cut := time.Now()

	t.Run("the others drop the cut-off node and re-run its call", func(t *testing.T) {
		eventually(t, leaseTTL+15*time.Second, "the others no longer list "+victim.name, func() bool {
			for _, n := range others {
				if v, ok := n.view(admin); !ok || contains(v.names(), victim.name) {
					return false
				}
			}
			return true
		})
		t.Logf("%s dropped %s after the cut", time.Since(cut).Round(10*time.Millisecond), victim.name)
		res := others[0].client(t, key).waitResult(id)
		if res["message"] != "success" || output(t, res)["env"] == victim.name {
			t.Fatalf("the cut-off node's call: %v; want success from a re-run elsewhere", res)
		}
	})

	// The held run answers now, on the cut-off node, late: whatever that
	// node makes of it (a write that fails without quorum, retried until
	// the link is back and then refused by the lease compare; or nothing,
	// its scheduler having abandoned the call when its lease lapsed) must
	// not replace the re-run's result. Its model must still be running to
	// answer: a node that stopped it would leave the check below nothing
	// to check, so that fails the test rather than pass it unchecked.
	var answered time.Time
	if held := c.firstRun(t, "late"); replicaAlive(held.Replica) {
		if err := os.WriteFile(release, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		eventually(t, time.Minute, "the held run answering", func() bool {
			_, err := os.Stat(release + ".answered")
			return err == nil
		})
		answered = time.Now()
	} else {
		t.Errorf("%s stopped the model process of the held run (replica %s) before it could answer late: "+
			"the check that a late result is discarded could not run", victim.name, held.Replica)
	}

	t.Run("the cut-off node takes no new work", func(t *testing.T) {
		began := time.Now()
		status, r, err := tryDo("POST", victim.base+"/start/v4", nil,
			fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-slow","modelInputs":%s}`, key, c.logged("while-cut", "")))
		if err != nil || status == http.StatusOK && r["message"] == "success" {
			t.Errorf("a start through the cut-off node: HTTP %d %v %v; want an error", status, r, err)
		}
		if took := time.Since(began); took > 20*time.Second {
			t.Errorf("the cut-off node answered a start after %s", took)
		}
		if runs := c.runs(t)["while-cut"]; len(runs) > 0 {
			t.Errorf("a call started through the cut-off node ran on %v", runs)
		}
	})

	victim.heal(t)
	t.Run("after healing, its late result is discarded and it rejoins", func(t *testing.T) {
		eventually(t, time.Minute, victim.name+" listed again by every node", func() bool {
			for _, n := range c.nodes {
				if v, ok := n.view(admin); !ok || !contains(v.names(), victim.name) {
					return false
				}
			}
			return true
		})
		before := others[0].client(t, key).check(id, false)
		if before["message"] != "success" || output(t, before)["env"] == victim.name {
			t.Fatalf("after healing: %v; want the re-run's result", before)
		}
		// Nothing signals that the cut-off node is done with the late
		// answer: a write of it may be retried until the store gives up
		// (RetryFor, 15 s, plus a request timeout of 5 s). So every node
		// must go on answering the re-run's result until then: what is
		// checked is that a thing does not happen within that window.
		for first := true; first || time.Since(answered) < lateWriteWindow; first = false {
			for _, n := range c.nodes {
				after := n.client(t, key).check(id, false)
				if after["message"] != "success" || output(t, after)["env"] != output(t, before)["env"] {
					t.Fatalf("check on %s %s after the late answer: %v; want the re-run's %v",
						n.name, time.Since(answered).Round(time.Millisecond), after, before)
				}
			}
		}
		r := victim.client(t, key).start("mk-slow", c.logged("rejoined", ""), false)
		if r["message"] != "success" {
			t.Errorf("a call through the rejoined node: %v", r)
		}
		if runs := c.runs(t)["while-cut"]; len(runs) > 0 {
			t.Errorf("the call refused while cut off ran later on %v", runs)
		}
	})
}

// Issue 22, "Done when" 5: with two of the three members killed, the node
// left answers `error: cluster unavailable` (HTTP 503) within a bounded
// time instead of hanging, and serves again once they are back. Issue 42:
// the survivor waits the outage out through every sweep it runs meanwhile
// (every 2 s here), never exiting, and serves again with nothing
// restarted.
func TestThreeNodeClusterWithoutQuorumAnswersUnavailable(t *testing.T) {
	echo := echoDir(t)
	c := newThreeNodes(t, clusterOpts{extra: healExtra})
	n1 := c.nodes[0]
	key := n1.d.createKey("acme", false)
	n1.d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, marker(), "") + "    maxReplicas: 3\n")
	first := n1.client(t, key).start("mk-echo", `{}`, false)
	if first["message"] != "success" {
		t.Fatalf("before: %v", first)
	}
	c.nodes[1].d.kill()
	c.nodes[2].d.kill()

	// Every etcd request is bounded (5 s) and a commit retried through an
	// etcd election for at most 15 s: 20 s is the most an answer may take.
	const bound = 20 * time.Second
	for _, req := range []struct{ what, path, body string }{
		{"start", "/start/v4", fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","modelInputs":{}}`, key)},
		{"check", "/check/v4/", fmt.Sprintf(`{"apiKey":%q,"callID":%q}`, key, first["callID"])},
	} {
		t.Run("a "+req.what+" without quorum", func(t *testing.T) {
			began := time.Now()
			status, r, err := tryDo("POST", n1.base+req.path, nil, req.body)
			took := time.Since(began)
			if err != nil {
				t.Fatal(err)
			}
			msg, _ := r["message"].(string)
			if status != http.StatusServiceUnavailable || !strings.HasPrefix(msg, "error: cluster unavailable") {
				t.Errorf("HTTP %d %v; want 503 `error: cluster unavailable; retry`", status, r)
			}
			if took > bound {
				t.Errorf("answered after %s, want within %s", took, bound)
			}
		})
	}

	// The requests above went unanswered for a whole request bound (5 s):
	// node 1 knows etcd is down, and answers 503 within a try of half a
	// second per etcd read, not the bound again.
	t.Run("a 503 comes at once once the node knows it has no quorum", func(t *testing.T) {
		began := time.Now()
		status, r, err := tryDo("POST", n1.base+"/check/v4/", nil, fmt.Sprintf(`{"apiKey":%q,"callID":%q}`, key, first["callID"]))
		if took := time.Since(began); err != nil || status != http.StatusServiceUnavailable || took > 3*time.Second {
			t.Errorf("a check without quorum, known: HTTP %d %v %v after %s; want 503 within about a second", status, r, err, took)
		}
	})

	// Both sweeps have met the outage, and the survivor runs on: the
	// outage outlasts their interval.
	for _, job := range []string{`"job":"expire calls"`, `"job":"expire usage"`} {
		n1.d.logs.waitForAll(t, time.Minute, outageLine, job)
	}
	n1.alive(t, "without quorum")

	c.nodes[1].launch(t)
	c.nodes[2].launch(t)
	c.nodes[1].waitServing(t)
	c.nodes[2].waitServing(t)
	t.Run("service resumes with quorum", func(t *testing.T) {
		n1.alive(t, "the others back")
		var r map[string]any
		eventually(t, time.Minute, "a call through node 1 succeeds", func() bool {
			r, _ = n1.client(t, key).tryStart("mk-echo", `{}`, false)
			return r["message"] == "success"
		})
		if got := n1.client(t, key).check(first["callID"].(string), false); got["message"] != "success" {
			t.Errorf("the call from before: %v", got)
		}
	})

	// Without quorum a node's last etcd requests (its resign, the revoke
	// of its lease, its last writes) cannot be answered: its shutdown
	// does not wait them out (it took about 35 s).
	t.Run("a node without quorum shuts down within seconds", func(t *testing.T) {
		c.nodes[1].d.kill()
		c.nodes[2].d.kill()
		began := time.Now()
		n1.d.stop()
		if took := time.Since(began); took > 10*time.Second {
			t.Errorf("node 1 took %s to stop without quorum; want within 10 s", took)
		}
	})
}

// Issue 22, "Done when" 6: a GPU project's replicas go on a node with a
// free (simulated) GPU: node 1 has none, nodes 2 and 3 one each. The first
// GPU project takes one of them, the second the other, and a call through
// node 1 reaches it.
func TestThreeNodeClusterPlacesGPUProjectsOnFreeGPUs(t *testing.T) {
	echo := echoDir(t)
	mark := marker()
	oneGPU := "gpu:\n  simulate:\n    - {name: Sim A, memoryMiB: 16384}\n"
	c := newThreeNodes(t, clusterOpts{perNode: [3]string{"gpu:\n  disabled: true\n", oneGPU, oneGPU}})
	n1 := c.nodes[0]
	admin := n1.d.createKey("acme", true)
	key := n1.d.createKey("acme", false)
	c.waitLeader(t, admin, time.Minute, c.nodes[:])
	onlyOn := func(project string) (node string) {
		c.waitReplicas(t, admin, mark, project, 2*time.Minute, c.nodes[:], "one replica on one node", func(m map[string]int) bool {
			node = ""
			for n, count := range m {
				if count == 1 && len(m) == 1 {
					node = n
				}
			}
			return node != ""
		})
		return node
	}
	c.nodes[1].d.apply("projects:\n" + echoProject("first", "acme", "mk-first", echo, mark, "") + "    gpus: 1\n    minReplicas: 1\n    maxReplicas: 1\n")
	first := onlyOn("first")
	if first == "node-1" {
		t.Fatalf("first's replica on node-1, which has no GPU")
	}
	c.nodes[1].d.apply("projects:\n" + echoProject("second", "acme", "mk-second", echo, mark, "") + "    gpus: 1\n    minReplicas: 1\n    maxReplicas: 1\n")
	second := onlyOn("second")
	if second == "node-1" || second == first {
		t.Fatalf("second's replica on %s (first's on %s); want the other node with a GPU", second, first)
	}
	cl := n1.client(t, key)
	if r := cl.start("mk-second", `{"env":"E2E_NODE"}`, false); r["message"] != "success" || output(t, r)["env"] != second {
		t.Errorf("a call to second through node-1: %v; want it run on %s", r, second)
	}
	if r := cl.start("mk-second", `{"env":"CUDA_VISIBLE_DEVICES"}`, false); r["message"] != "success" || output(t, r)["env"] != simGPU0 {
		t.Errorf("second's replica sees GPUs %v; want its node's %s", r, simGPU0)
	}
}

// Tools of the scenarios above (threenode_test.go has the harness).

// node returns the node named name.
func (c *threeNodes) node(name string) *clusterNode {
	for _, n := range c.nodes {
		if n.name == name {
			return n
		}
	}
	c.t.Fatalf("no node %q", name)
	return nil
}

// cut takes the node's cluster link down: it can no longer reach the other
// nodes nor they it; the test still reaches its API.
func (n *clusterNode) cut(t *testing.T) { n.link(t, "down") }

// heal puts the node's cluster link back.
func (n *clusterNode) heal(t *testing.T) { n.link(t, "up") }

func (n *clusterNode) link(t *testing.T, state string) {
	t.Helper()
	if n.hostEnd == "" {
		t.Fatal("only an isolated cluster (clusterOpts.isolated) can cut a node off")
	}
	if out, err := exec.Command("ip", "link", "set", n.hostEnd, state).CombinedOutput(); err != nil {
		t.Fatalf("ip link set %s %s: %v: %s", n.hostEnd, state, err, out)
	}
}

// firstRun is the first logged run of tag.
func (c *threeNodes) firstRun(t *testing.T, tag string) run {
	t.Helper()
	for _, r := range c.runLines(t) {
		if r.Inputs.Tag == tag {
			return r
		}
	}
	t.Fatalf("no run of %s logged", tag)
	return run{}
}

// replicaAlive reports whether a process of the replica lives (one with
// INFERD_REPLICA_ID=id, not a zombie): the pid a model reports is of its
// PID namespace, not the test's.
func replicaAlive(id string) bool {
	return len(processesWithEnvVar("INFERD_REPLICA_ID", id)) > 0
}

// waitReplicas waits until want holds of the marked project's model
// processes per node; on timeout it fails with those counts and the
// placement the nodes in on show.
func (c *threeNodes) waitReplicas(t *testing.T, adminKey, mark, project string, timeout time.Duration, on []*clusterNode, what string, want func(map[string]int) bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		m := modelProcesses(mark, project)
		if want(m) {
			return
		}
		if time.Now().After(deadline) {
			var seen []string
			for _, n := range on {
				v, _ := n.view(adminKey)
				seen = append(seen, fmt.Sprintf("%s: leader %q, nodes %v, placement %+v", n.name, v.Leader, v.names(), v.Placement))
			}
			t.Fatalf("timed out after %s waiting for %s: %s's model processes per node %v; %s", timeout, what, project, m, strings.Join(seen, "; "))
		}
		time.Sleep(50 * time.Millisecond) // processes come and go with no signal to wait on
	}
}

// modelProcesses counts the marked project's model processes per node (the
// E2E_NODE in their environment).
func modelProcesses(mark, project string) map[string]int {
	out := map[string]int{}
	for _, pid := range processesWithEnv(mark) {
		env := readEnviron(pid)
		if !strings.Contains(env, "INFERD_PROJECT_ID="+project+"\x00") {
			continue
		}
		for _, kv := range strings.Split(env, "\x00") {
			if name, ok := strings.CutPrefix(kv, "E2E_NODE="); ok {
				out[name]++
			}
		}
	}
	return out
}

// memberStatus is what etcd's JSON gateway answers for a member's status
// (POST /v3/maintenance/status): its own id and the raft leader's.
type memberStatus struct {
	Header struct {
		MemberID string `json:"member_id"`
	} `json:"header"`
	Leader string `json:"leader"`
}

func (n *clusterNode) etcdStatus(t *testing.T) memberStatus {
	t.Helper()
	status, raw := doRaw(t, "POST", n.etcdURL+"/v3/maintenance/status", nil, "{}")
	var st memberStatus
	if err := json.Unmarshal(raw, &st); err != nil || status != http.StatusOK || st.Header.MemberID == "" {
		t.Fatalf("etcd status of %s: HTTP %d %s (%v)", n.name, status, raw, err)
	}
	return st
}

// makeRaftLeader moves etcd's raft leadership to n's member (etcd's
// MoveLeader, asked of the current leader through the JSON gateway) and
// waits until every member sees it there.
func (c *threeNodes) makeRaftLeader(t *testing.T, n *clusterNode) {
	t.Helper()
	target := n.etcdStatus(t).Header.MemberID
	if n.etcdStatus(t).Leader != target {
		var leader *clusterNode
		for _, m := range c.nodes {
			if st := m.etcdStatus(t); st.Header.MemberID == st.Leader {
				leader = m
			}
		}
		if leader == nil {
			t.Fatal("no etcd member leads raft")
		}
		status, raw := doRaw(t, "POST", leader.etcdURL+"/v3/maintenance/transfer-leadership", nil, fmt.Sprintf(`{"targetID":%q}`, target))
		if status != http.StatusOK {
			t.Fatalf("move etcd's raft leadership from %s to %s: HTTP %d %s", leader.name, n.name, status, raw)
		}
	}
	eventually(t, 30*time.Second, n.name+" leading etcd's raft, as every member sees", func() bool {
		for _, m := range c.nodes {
			if m.etcdStatus(t).Leader != target {
				return false
			}
		}
		return true
	})
}
