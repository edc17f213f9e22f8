package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"inferd/bench/loadgen"
)

// The cluster step (make bench-cluster, and part of make bench): three
// inferd nodes in cluster mode on this one box, each running one member of
// an embedded etcd cluster, measured side by side with the single box the
// suite already runs, on the same no-op model. All of them share the
// machine's cores, so the figures are what cluster mode costs a call (etcd
// records, group commits replicated to three members, forwarding), not
// what three boxes would add up to.

// clusterManifest: noop keeps one replica on each node (its minimum is the
// cluster's), so a start through any node runs there, as the single box's
// noop runs on its one replica; one keeps a single replica, so a start
// through a node it is not placed on is forwarded to the node it is.
const clusterManifest = `projects:
  - {id: noop, team: bench, modelKey: mk-noop, command: [%[1]q], concurrency: 64, minReplicas: 3, maxReplicas: 3, bootTimeout: 30}
  - {id: one, team: bench, modelKey: mk-one, command: [%[1]q], concurrency: 64, minReplicas: 1, maxReplicas: 1, bootTimeout: 30}
`

const clusterSection = `cluster:
  name: %s
  secretFile: %s
  etcd:
    embed:
      peerURL: %s
      clientURL: %s
      initialCluster: %s
`

// benchCluster is the three nodes: their base URLs and an API key.
type benchCluster struct {
	bases  [3]string
	pids   [3]int
	pprof  string // node-1's profiles (-profile)
	apiKey string
}

// startCluster starts the three nodes under e.dir/cluster and waits until
// each answers /readyz, then applies the manifest and makes a key through
// node 1 (in cluster mode the admin CLI talks to a running daemon).
func startCluster(ctx context.Context, o options, e *env) (*benchCluster, error) {
	dir := filepath.Join(e.dir, "cluster")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	secret := filepath.Join(dir, "secret")
	if err := os.WriteFile(secret, []byte(strings.Repeat("bench-cluster-secret-", 3)), 0o600); err != nil {
		return nil, err
	}
	type node struct {
		name, cfg, peer, client string
		port                    int
	}
	var nodes [3]node
	var initial []string
	for i := range nodes {
		ports := make([]int, 3)
		for j := range ports {
			p, err := freePort()
			if err != nil {
				return nil, err
			}
			ports[j] = p
		}
		n := node{name: fmt.Sprintf("node-%d", i+1), port: ports[0],
			peer: fmt.Sprintf("http://127.0.0.1:%d", ports[1]), client: fmt.Sprintf("http://127.0.0.1:%d", ports[2])}
		n.cfg = filepath.Join(dir, n.name+".yaml")
		nodes[i] = n
		initial = append(initial, n.name+"="+n.peer)
	}
	c := &benchCluster{}
	for i, n := range nodes {
		conf := fmt.Sprintf(inferdConf, n.port, filepath.Join(dir, n.name), sandboxOn) +
			fmt.Sprintf(clusterSection, n.name, secret, n.peer, n.client, strings.Join(initial, ","))
		if err := os.WriteFile(n.cfg, []byte(conf), 0o644); err != nil {
			return nil, err
		}
		var env []string
		if i == 0 && o.profile != "" {
			port, err := freePort()
			if err != nil {
				return nil, err
			}
			c.pprof = fmt.Sprintf("127.0.0.1:%d", port)
			env = []string{"INFERD_PPROF=" + c.pprof}
		}
		p, err := start(n.name, filepath.Join(dir, n.name+".log"), env, o.inferd, "--config", n.cfg, "serve")
		if err != nil {
			return nil, err
		}
		e.procs = append(e.procs, p)
		c.bases[i] = fmt.Sprintf("http://127.0.0.1:%d", n.port)
		c.pids[i] = p.pid()
	}
	for _, base := range c.bases {
		if err := waitHTTP(ctx, "GET", base+"/readyz", 90*time.Second); err != nil {
			return nil, err
		}
	}
	mf := filepath.Join(dir, "projects.yaml")
	if err := os.WriteFile(mf, fmt.Appendf(nil, clusterManifest, o.noop), 0o644); err != nil {
		return nil, err
	}
	if out, err := exec.Command(o.inferd, "--config", nodes[0].cfg, "apply", "-f", mf).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("inferd apply on node-1: %v: %s", err, out)
	}
	out, err := exec.Command(o.inferd, "--config", nodes[0].cfg, "key", "create", "--team", "bench").Output()
	if err != nil {
		return nil, fmt.Errorf("inferd key create on node-1: %w", err)
	}
	lines := strings.Fields(strings.TrimSpace(string(out)))
	c.apiKey = lines[len(lines)-1]
	return c, nil
}

func (c *benchCluster) spec(name string, node int, t loadgen.Target, modelKey string, conc int) runSpec {
	var pprof string
	if node == 0 {
		pprof = c.pprof
	}
	var peers []int
	for i, pid := range c.pids {
		if i != node {
			peers = append(peers, pid)
		}
	}
	return runSpec{name: name, pid: c.pids[node], base: c.bases[node], pprof: pprof, peers: peers, etcdBases: c.bases[:],
		cfg: loadgen.Config{Target: t, URL: c.bases[node], APIKey: c.apiKey, ModelKey: modelKey, Concurrency: conc}}
}

// measureCluster compares sync starts through the cluster with the single
// box: latency at concurrency 1 (through each node for the project with one
// replica: one of them runs it, the other two forward) and throughput at
// concurrency 64.
func measureCluster(ctx context.Context, e *env, o options, r *report) error {
	c, err := startCluster(ctx, o, e)
	if err != nil {
		return err
	}
	res, err := sideBySide(ctx, o, []runSpec{
		e.inferd("single box", loadgen.Start, "mk-noop", 1),
		c.spec("cluster, node-1", 0, loadgen.Start, "mk-noop", 1),
		c.spec("cluster, 1 replica, via node-1", 0, loadgen.Start, "mk-one", 1),
		c.spec("cluster, 1 replica, via node-2", 1, loadgen.Start, "mk-one", 1),
		c.spec("cluster, 1 replica, via node-3", 2, loadgen.Start, "mk-one", 1),
	})
	if err != nil {
		return err
	}
	r.table("Cluster mode (3 nodes on this box) vs single box: sync start latency, no-op model, concurrency 1", res,
		"single box", "single box", "single box", "cluster, node-1",
		"cluster, 1 replica, via node-1", "cluster, 1 replica, via node-2", "cluster, 1 replica, via node-3")
	single, local := res["single box"], res["cluster, node-1"]
	clusterLatencyRow(r, single, local)
	slowest := local
	for _, n := range []string{"cluster, 1 replica, via node-1", "cluster, 1 replica, via node-2", "cluster, 1 replica, via node-3"} {
		if res[n].pct(50) > slowest.pct(50) {
			slowest = res[n]
		}
	}
	r.add("Added latency, sync start forwarded to the node running the replica (slowest node), p50",
		dur(slowest.pct(50)-local.pct(50)), "", true)

	res, err = sideBySide(ctx, o, []runSpec{
		e.inferd("single box", loadgen.Start, "mk-noop", 64),
		c.spec("cluster, node-1", 0, loadgen.Start, "mk-noop", 64),
	})
	if err != nil {
		return err
	}
	r.table("Cluster mode (3 nodes on this box) vs single box: sync start throughput, no-op model, concurrency 64", res,
		"single box", "single box", "single box", "cluster, node-1")
	clusterThroughputRows(r, res["single box"], res["cluster, node-1"])
	return nil
}

func clusterLatencyRow(r *report, single, node *merged) {
	add50 := node.pct(50) - single.pct(50)
	r.add("Added latency, sync start, 3-node cluster vs single box, c=1, p50 / p99",
		dur(add50)+" / "+dur(node.pct(99)-single.pct(99)), "p50 ≤ 1 ms", add50 <= time.Millisecond)
}

func clusterThroughputRows(r *report, single, node *merged) {
	ratio := node.throughput() / single.throughput()
	r.add("Throughput at c=64, no-op model, 3-node cluster (through one node) / single box", pct(ratio), "≥ 50%", ratio >= 0.5)
	cpuRow(r, "sync start through a cluster node, concurrency 64", node)
	all := node.cpuPerCall() + node.peerCPUPerCall()
	r.add("CPU per sync call through the cluster, all three nodes (each with its etcd member), c=64 / single box's",
		dur(all)+" / "+dur(single.cpuPerCall()), "", true)
	etcdRows(r, "c=64", node)
}

// etcdRows are what the three nodes asked of etcd per call served through
// node: writes (each applied and made durable by every member), reads and
// requests (each a round to the cluster), from their inferd_etcd_*_total.
func etcdRows(r *report, how string, node *merged) {
	calls := float64(node.requests + node.warm)
	if calls == 0 || node.etcd.requests == 0 {
		return
	}
	w := node.etcd.writes / calls
	r.add("etcd writes per sync call, all three nodes, "+how, fmt.Sprintf("%.1f", w), "≤ 4", w <= 4)
	r.add("etcd requests / reads per sync call, all three nodes, "+how,
		fmt.Sprintf("%.1f / %.1f", node.etcd.requests/calls, node.etcd.reads/calls), "", true)
}

// measureClusterQuick is make bench-quick's cluster step: the two figures
// with targets, in one interleaved run.
func measureClusterQuick(ctx context.Context, e *env, o options, r *report) error {
	c, err := startCluster(ctx, o, e)
	if err != nil {
		return err
	}
	res, err := sideBySide(ctx, o, []runSpec{
		e.inferd("single box, c=1", loadgen.Start, "mk-noop", 1),
		c.spec("cluster node-1, c=1", 0, loadgen.Start, "mk-noop", 1),
		e.inferd("single box, c=64", loadgen.Start, "mk-noop", 64),
		c.spec("cluster node-1, c=64", 0, loadgen.Start, "mk-noop", 64),
	})
	if err != nil {
		return err
	}
	r.table("Cluster mode (3 nodes on this box) vs single box, sync starts, no-op model", res,
		"single box, c=1", "single box, c=64",
		"single box, c=1", "cluster node-1, c=1", "single box, c=64", "cluster node-1, c=64")
	clusterLatencyRow(r, res["single box, c=1"], res["cluster node-1, c=1"])
	etcdRows(r, "c=1", res["cluster node-1, c=1"])
	clusterThroughputRows(r, res["single box, c=64"], res["cluster node-1, c=64"])
	return nil
}
