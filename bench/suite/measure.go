package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"inferd/bench/loadgen"
	"inferd/bench/payload"
)

// run is one named load configuration in a side-by-side comparison.
type runSpec struct {
	name string
	cfg  loadgen.Config
	// pid, when set, is the inferd whose CPU time (schedstat) and group
	// commits (its /metrics at base) each slice measures; pprof is the
	// address it serves profiles on (-profile).
	pid         int
	base, pprof string
	// peers are processes whose CPU time each slice measures beside pid's
	// (a cluster's other nodes, each running an etcd member).
	peers []int
	// etcdBases are the cluster nodes whose etcd requests each slice counts
	// (their inferd_etcd_*_total): all of them, base's included.
	etcdBases []string
}

func (e *env) model(name, url string, c int) runSpec {
	return runSpec{name: name, cfg: loadgen.Config{Target: loadgen.Model, URL: url, Concurrency: c}}
}

func (e *env) inferd(name string, t loadgen.Target, modelKey string, c int) runSpec {
	return runSpec{name: name, pid: e.inferdPid, base: e.base, pprof: e.pprof,
		cfg: loadgen.Config{Target: t, URL: e.base, APIKey: e.apiKey, ModelKey: modelKey, Concurrency: c}}
}

// sideBySide runs each spec for o.phase, o.rounds times, interleaved (a, b,
// c, a, b, c, ...) so that a noisy neighbour hits every target alike, and
// merges each spec's slices. With -profile, each inferd slice of the first
// round is profiled (CPU, block, mutex) and of the second traced.
func sideBySide(ctx context.Context, o options, specs []runSpec) (map[string]*merged, error) {
	out := map[string]*merged{}
	for _, s := range specs {
		s.cfg.Client = loadgen.NewClient(s.cfg.Concurrency)
		s.cfg.Warmup = 2
		if _, err := loadgen.Run(ctx, withCount(s.cfg, 1)); err != nil { // warm connections and replicas
			return nil, err
		}
		out[s.name] = &merged{name: s.name, concurrency: s.cfg.Concurrency}
	}
	for round := range o.rounds {
		for _, s := range specs {
			cfg := s.cfg
			cfg.Duration = o.phase
			cfg.Client = loadgen.NewClient(cfg.Concurrency)
			cfg.Warmup = 1
			prof := o.profiler(ctx, s, round)
			etcd0 := etcdOpsOf(ctx, s.etcdBases)
			commits0, cpu0, peers0 := commitsOf(ctx, s.base), cpuOf(s.pid), cpuOfAll(s.peers) // the metrics read outside the CPU figure
			r, err := loadgen.Run(ctx, cfg)
			if err != nil {
				return nil, err
			}
			cpu, commits := cpuOf(s.pid)-cpu0, commitsOf(ctx, s.base).minus(commits0)
			out[s.name].etcd.add(etcdOpsOf(ctx, s.etcdBases).minus(etcd0))
			peerCPU := cpuOfAll(s.peers) - peers0
			prof.finish()
			cfg.Client.CloseIdleConnections()
			m := out[s.name]
			m.add(r, cpu, cfg.Warmup*cfg.Concurrency)
			m.peerCPU += peerCPU
			m.commits.n += commits.n
			m.commits.secs += commits.secs
		}
	}
	return out, nil
}

// etcdOps is what cluster nodes asked of etcd (their inferd_etcd_*_total).
type etcdOps struct{ requests, reads, writes float64 }

func (e etcdOps) minus(o etcdOps) etcdOps {
	return etcdOps{e.requests - o.requests, e.reads - o.reads, e.writes - o.writes}
}

func (e *etcdOps) add(o etcdOps) {
	e.requests, e.reads, e.writes = e.requests+o.requests, e.reads+o.reads, e.writes+o.writes
}

// etcdOpsOf sums the counters of the nodes at bases (zero for none, or a
// build without them).
func etcdOpsOf(ctx context.Context, bases []string) etcdOps {
	var sum etcdOps
	for _, b := range bases {
		req, err1 := metricSum(ctx, b, "inferd_etcd_requests_total")
		rd, err2 := metricSum(ctx, b, "inferd_etcd_reads_total")
		wr, err3 := metricSum(ctx, b, "inferd_etcd_writes_total")
		if err1 == nil && err2 == nil && err3 == nil {
			sum.add(etcdOps{req, rd, wr})
		}
	}
	return sum
}

// commitStats is a daemon's group-commit counters (its /metrics).
type commitStats struct{ n, secs float64 }

func (c commitStats) minus(o commitStats) commitStats { return commitStats{c.n - o.n, c.secs - o.secs} }

func commitsOf(ctx context.Context, base string) commitStats {
	if base == "" {
		return commitStats{}
	}
	n, err1 := metricSum(ctx, base, "inferd_store_commits_total")
	secs, err2 := metricSum(ctx, base, "inferd_store_commit_seconds_total")
	if err1 != nil || err2 != nil {
		return commitStats{}
	}
	return commitStats{n, secs}
}

// cpuOf is the CPU time inferd's threads have run (0 for no pid).
func cpuOf(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	d, err := payload.CPU(pid)
	if err != nil {
		return 0
	}
	return d
}

// cpuOfAll is the CPU time of all of pids' threads.
func cpuOfAll(pids []int) time.Duration {
	var d time.Duration
	for _, pid := range pids {
		d += cpuOf(pid)
	}
	return d
}

func withCount(c loadgen.Config, n int) loadgen.Config {
	c.Count, c.Duration = n*c.Concurrency, 0
	return c
}

// merged is the union of one spec's slices.
type merged struct {
	name          string
	concurrency   int
	lat           []time.Duration
	requests, err int
	elapsed       time.Duration
	cpu           time.Duration // inferd's CPU time during the slices (runSpec.pid)
	peerCPU       time.Duration // runSpec.peers' CPU time during the slices
	warm          int           // warm-up requests in those slices, not in requests
	commits       commitStats   // the daemon's group commits during the slices
	etcd          etcdOps       // what the cluster's nodes asked of etcd during the slices
	firstErr      string
}

func (m *merged) add(r *loadgen.Result, cpu time.Duration, warm int) {
	m.warm += warm
	m.lat = append(m.lat, r.Latencies()...)
	m.requests += r.Requests
	m.err += r.Errors
	m.elapsed += r.Elapsed
	m.cpu += cpu
	if m.firstErr == "" {
		m.firstErr = r.FirstError
	}
}

func (m *merged) pct(p float64) time.Duration {
	slices.Sort(m.lat)
	return loadgen.Percentile(m.lat, p)
}

func (m *merged) throughput() float64 { return float64(len(m.lat)) / m.elapsed.Seconds() }

// cpuPerCall is inferd's CPU time per request it served in the slices,
// warm-ups included.
func (m *merged) cpuPerCall() time.Duration { return m.perCall(m.cpu) }

// peerCPUPerCall is the peers' CPU time per request, as cpuPerCall.
func (m *merged) peerCPUPerCall() time.Duration { return m.perCall(m.peerCPU) }

// perCall is d spread over the requests of the slices, warm-ups included.
func (m *merged) perCall(d time.Duration) time.Duration {
	if m.requests+m.warm == 0 {
		return 0
	}
	return d / time.Duration(m.requests+m.warm)
}

func measureIdle(ctx context.Context, e *env, o options, r *report) error {
	rss, err := rssBytes(e.inferdPid)
	if err != nil {
		return err
	}
	r.idleRSS = rss
	r.add(fmt.Sprintf("RSS idle (%d projects, %d replicas up, no calls yet)", len(e.projects), e.alwaysOn()), mib(rss), "≤ 40 MB", rss <= 40<<20)
	return nil
}

func measureLatency(ctx context.Context, e *env, o options, r *report) error {
	res, err := sideBySide(ctx, o, append([]runSpec{
		e.model("direct", e.direct, 1),
		e.model("nginx", e.nginx, 1),
		e.inferd("inferd start", loadgen.Start, "mk-noop", 1),
		e.inferd("inferd startOnly+check", loadgen.StartOnly, "mk-noop", 1),
		e.inferd("inferd start, durability answered", loadgen.Start, "mk-noopans", 1),
		e.goHopSpec("Go hop", 1),
		e.durableHopSpec("durable Go hop", 1),
	}, e.vsSpecs("inferd start", "mk-noop", 1)...))
	if err != nil {
		return err
	}
	r.table("Latency, no-op model, concurrency 1 (closed loop)", res, "direct", "direct",
		withVs(e, "inferd start", "direct", "nginx", "inferd start", "inferd startOnly+check", "inferd start, durability answered", "Go hop", "durable Go hop")...)
	d, s, n := res["direct"], res["inferd start"], res["nginx"]
	r.warmStart = s.pct(50)
	addedLatencyRows(r, d, s)
	r.add("Added latency, nginx vs direct, p50 / p99 (for scale)",
		dur(n.pct(50)-d.pct(50))+" / "+dur(n.pct(99)-d.pct(99)), "", true)
	hopLatencyRow(r, d, res["Go hop"])
	floorLatencyRows(r, d, s, res["Go hop"], res["durable Go hop"])
	answeredLatencyRow(r, d, res["inferd start, durability answered"], res["Go hop"])
	vsLatencyRow(r, d, s, res[vsName("inferd start")])
	cpuRow(r, "sync start, concurrency 1", s)
	return nil
}

// measureConcurrency16 is the middle load: 16 clients, where neither the
// model nor the two cores are saturated, so what inferd adds per call shows.
func measureConcurrency16(ctx context.Context, e *env, o options, r *report) error {
	res, err := sideBySide(ctx, o, append([]runSpec{
		e.model("direct", e.direct, 16),
		e.inferd("inferd start", loadgen.Start, "mk-noop", 16),
		e.model("nginx", e.nginx, 16),
		e.goHopSpec("Go hop", 16),
		e.durableHopSpec("durable Go hop", 16),
		e.inferd("inferd start, durability answered", loadgen.Start, "mk-noopans", 16),
		e.model("direct, 10 ms model", e.direct10, 16),
		e.inferd("inferd start, 10 ms model", loadgen.Start, "mk-noop10", 16),
	}, e.vsSpecs("inferd start", "mk-noop", 16)...))
	if err != nil {
		return err
	}
	r.table("Throughput, concurrency 16 (closed loop)", res, "direct", "direct",
		withVs(e, "inferd start", "direct", "inferd start", "nginx", "Go hop", "durable Go hop", "inferd start, durability answered",
			"direct, 10 ms model", "inferd start, 10 ms model")...)
	c16Row(r, res["direct"], res["inferd start"])
	hopC16Rows(r, res["direct"], res["nginx"], res["Go hop"])
	floorThroughputRows(r, "c=16", res["inferd start"], res["Go hop"], res["durable Go hop"])
	answeredThroughputRow(r, "c=16", res["inferd start, durability answered"], res["durable Go hop"], 1)
	vsThroughputRow(r, "c=16", res["inferd start"], res[vsName("inferd start")])
	tenMsRow(r, "c=16, 1 replica", res["direct, 10 ms model"], res["inferd start, 10 ms model"], 0.95)
	cpuRow(r, "sync start, concurrency 16", res["inferd start"])
	return nil
}

func measureThroughputNoop(ctx context.Context, e *env, o options, r *report) error {
	res, err := sideBySide(ctx, o, append([]runSpec{
		e.model("direct", e.direct, 64),
		e.model("nginx", e.nginx, 64),
		e.inferd("inferd start", loadgen.Start, "mk-noop", 64),
		e.inferd("inferd startOnly+check", loadgen.StartOnly, "mk-noop", 64),
		e.goHopSpec("Go hop", 64),
		e.durableHopSpec("durable Go hop", 64),
		e.inferd("inferd start, durability answered", loadgen.Start, "mk-noopans", 64),
	}, e.vsSpecs("inferd start", "mk-noop", 64)...))
	if err != nil {
		return err
	}
	r.table("Throughput, no-op model, concurrency 64 (closed loop)", res, "direct", "nginx",
		withVs(e, "inferd start", "direct", "nginx", "inferd start", "inferd startOnly+check", "Go hop", "durable Go hop",
			"inferd start, durability answered")...)
	c64Row(r, res["nginx"], res["inferd start"])
	hopC64Rows(r, res["nginx"], res["Go hop"])
	floorThroughputRows(r, "c=64", res["inferd start"], res["Go hop"], res["durable Go hop"])
	answeredThroughputRow(r, "c=64", res["inferd start, durability answered"], res["durable Go hop"], 0)
	vsThroughputRow(r, "c=64", res["inferd start"], res[vsName("inferd start")])
	ratio := res["inferd startOnly+check"].throughput() / res["nginx"].throughput()
	r.add("Throughput at c=64, no-op model, startOnly+check / nginx", pct(ratio), "", true)
	cpuRow(r, "sync start, concurrency 64", res["inferd start"])
	return nil
}

func measureThroughput10ms(ctx context.Context, e *env, o options, r *report) error {
	res, err := sideBySide(ctx, o, []runSpec{
		e.model("direct", e.direct10, 64),
		e.inferd("inferd start, 1 replica × concurrency 64", loadgen.Start, "mk-noop10", 64),
		e.inferd("inferd start, 4 replicas × concurrency 16", loadgen.Start, "mk-noop10x4", 64),
	})
	if err != nil {
		return err
	}
	r.table("Throughput, 10 ms model, concurrency 64 (closed loop)", res, "direct", "direct",
		"direct", "inferd start, 1 replica × concurrency 64", "inferd start, 4 replicas × concurrency 16")
	tenMsRow(r, "c=64, 1 replica × concurrency 64", res["direct"], res["inferd start, 1 replica × concurrency 64"], 0.8)
	tenMsRow(r, "c=64, 4 replicas × concurrency 16", res["direct"], res["inferd start, 4 replicas × concurrency 16"], 0.8)
	return nil
}

// The hot path's figures and targets (issue 30), each from two targets of
// one interleaved run; make bench and make bench-quick print the same rows.

func addedLatencyRows(r *report, direct, start *merged) {
	add50, add99 := start.pct(50)-direct.pct(50), start.pct(99)-direct.pct(99)
	r.add("Added latency, sync start vs direct, c=1, p50", dur(add50), "≤ 0.4 ms", add50 <= 400*time.Microsecond)
	r.add("Added latency, sync start vs direct, c=1, p99", dur(add99), "≤ 2 ms", add99 <= 2*time.Millisecond)
}

func c16Row(r *report, direct, start *merged) {
	ratio := start.throughput() / direct.throughput()
	r.add("Throughput at c=16, no-op model, sync start / direct", pct(ratio), "≥ 50%", ratio >= 0.5)
}

func c64Row(r *report, nginx, start *merged) {
	ratio := start.throughput() / nginx.throughput()
	r.add("Throughput at c=64, no-op model, sync start / nginx", pct(ratio), "≥ 60%", ratio >= 0.6)
}

// The floor's rows are the scale for the c=1, c=16 and c=64 rows: what
// nginx and the Go hop (gohop.go: net/http in front of inferd's model
// client, nothing between) reach against the same denominators, and the
// Go hop's CPU per call beside inferd's.

func hopLatencyRow(r *report, direct, hop *merged) {
	r.add("Added latency, Go hop vs direct, c=1, p50 / p99 (for scale)",
		dur(hop.pct(50)-direct.pct(50))+" / "+dur(hop.pct(99)-direct.pct(99)), "", true)
}

func hopC16Rows(r *report, direct, nginx, hop *merged) {
	r.add("Throughput at c=16, no-op model, nginx / direct (for scale)", pct(nginx.throughput()/direct.throughput()), "", true)
	r.add("Throughput at c=16, no-op model, Go hop / direct (for scale)", pct(hop.throughput()/direct.throughput()), "", true)
	r.add("Go hop CPU per call (schedstat), c=16 (for scale)", dur(hop.cpuPerCall()), "", true)
}

func hopC64Rows(r *report, nginx, hop *merged) {
	r.add("Throughput at c=64, no-op model, Go hop / nginx (for scale)", pct(hop.throughput()/nginx.throughput()), "", true)
	r.add("Go hop CPU per call (schedstat), c=64 (for scale)", dur(hop.cpuPerCall()), "", true)
}

// floorLatencyRows and floorThroughputRows set inferd's sync start beside
// both hops of the same run: the durable hop (the bare hop plus one
// group-committed append and fdatasync per call) is the floor of any
// service that keeps docs/reliability.md's promise, and inferd's targets
// (issue 44) are ratios to it; the bare hop is for scale.
func floorLatencyRows(r *report, direct, start, bare, durable *merged) {
	added := func(m *merged) time.Duration { return m.pct(50) - direct.pct(50) }
	a, b, d := added(start), added(bare), added(durable)
	r.add("Added latency at c=1, p50, sync start ÷ durable Go hop's",
		fmt.Sprintf("%.2f× (%s against %s)", ratioOf(a, d), dur(a), dur(d)), "≤ 1.2×", a <= d*6/5)
	r.add("Added latency at c=1, p50, sync start ÷ bare Go hop's (for scale)",
		fmt.Sprintf("%.2f× (%s against %s)", ratioOf(a, b), dur(a), dur(b)), "", true)
	r.add("Durable Go hop CPU per call (schedstat), c=1 (for scale)", dur(durable.cpuPerCall()), "", true)
}

func floorThroughputRows(r *report, how string, start, bare, durable *merged) {
	rd := start.throughput() / durable.throughput()
	r.add("Throughput at "+how+", no-op model, sync start ÷ durable Go hop", fmt.Sprintf("%.2f", rd), "≥ 0.8", rd >= 0.8)
	r.add("Throughput at "+how+", no-op model, sync start ÷ bare Go hop (for scale)",
		fmt.Sprintf("%.2f", start.throughput()/bare.throughput()), "", true)
	r.add("Durable Go hop CPU per call (schedstat), "+how+" (for scale)", dur(durable.cpuPerCall()), "", true)
}

// answeredLatencyRow and answeredThroughputRow are the targets of
// durability: answered (issue 44): an added p50 at c=1 within 2× the bare
// hop's, at c=16 at least the durable hop's calls/s (target 0: for scale).
// The commit columns of the tables say how long an answered call's record
// waits for its commit.
func answeredLatencyRow(r *report, direct, answered, bare *merged) {
	a, b := answered.pct(50)-direct.pct(50), bare.pct(50)-direct.pct(50)
	r.add("durability answered: added latency at c=1, p50, ÷ bare Go hop's",
		fmt.Sprintf("%.2f× (%s against %s)", ratioOf(a, b), dur(a), dur(b)), "≤ 2×", a <= 2*b)
}

func answeredThroughputRow(r *report, how string, answered, durable *merged, target float64) {
	ratio := answered.throughput() / durable.throughput()
	if target == 0 {
		r.add("durability answered: throughput at "+how+", ÷ durable Go hop (for scale)", fmt.Sprintf("%.2f", ratio), "", true)
		return
	}
	r.add("durability answered: throughput at "+how+", ÷ durable Go hop", fmt.Sprintf("%.2f", ratio), fmt.Sprintf("≥ %.1f", target), ratio >= target)
}

func ratioOf(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

// vsSpecs is the -vs inferd's load beside the spec named name (none
// without -vs).
func (e *env) vsSpecs(name, modelKey string, c int) []runSpec {
	if e.vs == nil {
		return nil
	}
	return []runSpec{e.vs.inferd(vsName(name), loadgen.Start, modelKey, c)}
}

func vsName(name string) string { return name + " (-vs)" }

// withVs appends the -vs inferd's column for name to names, when there is one.
func withVs(e *env, name string, names ...string) []string {
	if e.vs == nil {
		return names
	}
	return append(names, vsName(name))
}

// vsLatencyRow and vsThroughputRow compare -inferd with -vs (nothing
// without -vs).
func vsLatencyRow(r *report, direct, start, vs *merged) {
	if vs == nil {
		return
	}
	a, b := start.pct(50)-direct.pct(50), vs.pct(50)-direct.pct(50)
	r.add("Added latency at c=1, p50, -inferd ÷ -vs", fmt.Sprintf("%.2f× (%s against %s)", ratioOf(a, b), dur(a), dur(b)), "", true)
	r.add("CPU per call at c=1, -inferd ÷ -vs", fmt.Sprintf("%.2f× (%s against %s)",
		ratioOf(start.cpuPerCall(), vs.cpuPerCall()), dur(start.cpuPerCall()), dur(vs.cpuPerCall())), "", true)
}

func vsThroughputRow(r *report, how string, start, vs *merged) {
	if vs == nil {
		return
	}
	r.add("Throughput at "+how+", -inferd ÷ -vs", fmt.Sprintf("%.2f", start.throughput()/vs.throughput()), "", true)
	r.add("CPU per call at "+how+", -inferd ÷ -vs", fmt.Sprintf("%.2f× (%s against %s)",
		ratioOf(start.cpuPerCall(), vs.cpuPerCall()), dur(start.cpuPerCall()), dur(vs.cpuPerCall())), "", true)
}

func tenMsRow(r *report, how string, direct, start *merged, target float64) {
	ratio := start.throughput() / direct.throughput()
	r.add("Throughput, 10 ms model, sync start / direct, "+how, pct(ratio), "≥ "+pct(target), ratio >= target)
}

func cpuRow(r *report, how string, start *merged) {
	d := start.cpuPerCall()
	r.add("inferd CPU per call (schedstat), "+how, dur(d), "≤ 60 µs (goal)", d <= 60*time.Microsecond)
}

// measureQuick is make bench-quick: the hot path's figures above in one
// interleaved run of every target (and the cluster's in a second), short
// slices, so a change sees what it costs in under a minute. Its ratios are
// noisier than make bench's; compare runs side by side.
func measureQuick(ctx context.Context, e *env, o options, r *report) error {
	specs := []runSpec{
		e.model("direct, c=1", e.direct, 1),
		e.inferd("start, c=1", loadgen.Start, "mk-noop", 1),
		e.inferd("start answered, c=1", loadgen.Start, "mk-noopans", 1),
		e.goHopSpec("Go hop, c=1", 1),
		e.durableHopSpec("durable Go hop, c=1", 1),
		e.model("direct, c=16", e.direct, 16),
		e.inferd("start, c=16", loadgen.Start, "mk-noop", 16),
		e.inferd("start answered, c=16", loadgen.Start, "mk-noopans", 16),
		e.model("nginx, c=16", e.nginx, 16),
		e.goHopSpec("Go hop, c=16", 16),
		e.durableHopSpec("durable Go hop, c=16", 16),
		e.model("nginx, c=64", e.nginx, 64),
		e.inferd("start, c=64", loadgen.Start, "mk-noop", 64),
		e.inferd("start answered, c=64", loadgen.Start, "mk-noopans", 64),
		e.goHopSpec("Go hop, c=64", 64),
		e.durableHopSpec("durable Go hop, c=64", 64),
		e.model("10 ms direct, c=16", e.direct10, 16),
		e.inferd("10 ms start, c=16", loadgen.Start, "mk-noop10", 16),
		e.model("10 ms direct, c=64", e.direct10, 64),
		e.inferd("10 ms start 1×64, c=64", loadgen.Start, "mk-noop10", 64),
		e.inferd("10 ms start 4×16, c=64", loadgen.Start, "mk-noop10x4", 64),
	}
	for _, c := range []int{1, 16, 64} {
		specs = append(specs, e.vsSpecs(fmt.Sprintf("start, c=%d", c), "mk-noop", c)...)
	}
	res, err := sideBySide(ctx, o, specs)
	if err != nil {
		return err
	}
	names := []string{"direct, c=1", "start, c=1", "start answered, c=1", "Go hop, c=1", "durable Go hop, c=1", "direct, c=16", "start, c=16",
		"start answered, c=16", "nginx, c=16", "Go hop, c=16", "durable Go hop, c=16", "nginx, c=64", "start, c=64", "start answered, c=64",
		"Go hop, c=64", "durable Go hop, c=64",
		"10 ms direct, c=16", "10 ms start, c=16", "10 ms direct, c=64", "10 ms start 1×64, c=64", "10 ms start 4×16, c=64"}
	if e.vs != nil {
		names = append(names, vsName("start, c=1"), vsName("start, c=16"), vsName("start, c=64"))
	}
	r.table("Hot path, one interleaved run (closed loops; no-op model unless 10 ms)", res, "direct, c=1", "direct, c=1", names...)
	addedLatencyRows(r, res["direct, c=1"], res["start, c=1"])
	c16Row(r, res["direct, c=16"], res["start, c=16"])
	c64Row(r, res["nginx, c=64"], res["start, c=64"])
	hopLatencyRow(r, res["direct, c=1"], res["Go hop, c=1"])
	hopC16Rows(r, res["direct, c=16"], res["nginx, c=16"], res["Go hop, c=16"])
	hopC64Rows(r, res["nginx, c=64"], res["Go hop, c=64"])
	floorLatencyRows(r, res["direct, c=1"], res["start, c=1"], res["Go hop, c=1"], res["durable Go hop, c=1"])
	floorThroughputRows(r, "c=16", res["start, c=16"], res["Go hop, c=16"], res["durable Go hop, c=16"])
	floorThroughputRows(r, "c=64", res["start, c=64"], res["Go hop, c=64"], res["durable Go hop, c=64"])
	answeredLatencyRow(r, res["direct, c=1"], res["start answered, c=1"], res["Go hop, c=1"])
	answeredThroughputRow(r, "c=16", res["start answered, c=16"], res["durable Go hop, c=16"], 1)
	answeredThroughputRow(r, "c=64", res["start answered, c=64"], res["durable Go hop, c=64"], 0)
	vsLatencyRow(r, res["direct, c=1"], res["start, c=1"], res[vsName("start, c=1")])
	vsThroughputRow(r, "c=16", res["start, c=16"], res[vsName("start, c=16")])
	vsThroughputRow(r, "c=64", res["start, c=64"], res[vsName("start, c=64")])
	tenMsRow(r, "c=16, 1 replica", res["10 ms direct, c=16"], res["10 ms start, c=16"], 0.95)
	tenMsRow(r, "c=64, 1 replica × concurrency 64", res["10 ms direct, c=64"], res["10 ms start 1×64, c=64"], 0.8)
	tenMsRow(r, "c=64, 4 replicas × concurrency 16", res["10 ms direct, c=64"], res["10 ms start 4×16, c=64"], 0.8)
	cpuRow(r, "sync start, concurrency 1", res["start, c=1"])
	cpuRow(r, "sync start, concurrency 16", res["start, c=16"])
	cpuRow(r, "sync start, concurrency 64", res["start, c=64"])
	return nil
}

// batchMaxWaitMs is project pass16's batch.maxWaitMs: the most a batch
// waits for more calls, and so the most batching may add to a lone call.
const batchMaxWaitMs = 5

// measureBatching runs one model, 20 ms + 1 ms per call and one pass at a
// time, as project pass1 (a call per pass) and pass16 (batches of up to 16
// calls), side by side: calls/s at c=64, where batching is for, and the
// latency at c=1, where it must cost a lone call no more than maxWaitMs.
func measureBatching(ctx context.Context, e *env, o options, r *report) error {
	res, err := sideBySide(ctx, o, []runSpec{
		e.inferd("no batching, c=64", loadgen.Start, "mk-pass1", 64),
		e.inferd("batch maxSize 16, c=64", loadgen.Start, "mk-pass16", 64),
	})
	if err != nil {
		return err
	}
	r.table("Batching, model of 20 ms + 1 ms per call (one pass at a time), concurrency 64", res,
		"no batching, c=64", "no batching, c=64", "no batching, c=64", "batch maxSize 16, c=64")
	ratio := res["batch maxSize 16, c=64"].throughput() / res["no batching, c=64"].throughput()
	r.add("Throughput at c=64, 20 ms + 1 ms per call model, batch maxSize 16 / no batching",
		fmt.Sprintf("%.1f×", ratio), "≥ 5×", ratio >= 5)

	res, err = sideBySide(ctx, o, []runSpec{
		e.inferd("no batching, c=1", loadgen.Start, "mk-pass1", 1),
		e.inferd("batch maxSize 16, c=1", loadgen.Start, "mk-pass16", 1),
	})
	if err != nil {
		return err
	}
	r.table("Batching, model of 20 ms + 1 ms per call, concurrency 1", res,
		"no batching, c=1", "no batching, c=1", "no batching, c=1", "batch maxSize 16, c=1")
	added := res["batch maxSize 16, c=1"].pct(50) - res["no batching, c=1"].pct(50)
	r.add(fmt.Sprintf("Added latency at c=1, batch maxSize 16 vs no batching, p50 (maxWaitMs %d)", batchMaxWaitMs),
		dur(added), fmt.Sprintf("≤ %d ms", batchMaxWaitMs), added <= batchMaxWaitMs*time.Millisecond)
	return nil
}

// measureBatchingExample is measureBatching on examples/batch, a Python
// ThreadingHTTPServer that keeps the default listen backlog (5): without
// batching the project declares concurrency 64, so 64 calls at once open 64
// connections to it, more than its backlog holds (docs/protocols.md,
// "Connecting to a replica"); no call may fail for it, and batching must
// still give ≥ 5×.
func measureBatchingExample(ctx context.Context, e *env, o options, r *report) error {
	res, err := sideBySide(ctx, o, []runSpec{
		e.inferd("example, no batching, concurrency 64, c=64", loadgen.Start, "mk-pyone", 64),
		e.inferd("example, batch maxSize 16, c=64", loadgen.Start, "mk-pybatch", 64),
	})
	if err != nil {
		return err
	}
	one, batch := res["example, no batching, concurrency 64, c=64"], res["example, batch maxSize 16, c=64"]
	r.table("Batching example (examples/batch: Python, default backlog; 20 ms + 1 ms per call), concurrency 64", res,
		one.name, one.name, one.name, batch.name)
	ratio := batch.throughput() / one.throughput()
	r.add("Throughput at c=64, batching example, batch maxSize 16 / no batching (concurrency 64)",
		fmt.Sprintf("%.1f×", ratio), "≥ 5×", ratio >= 5)
	r.add("Failed calls, batching example without batching (64 connections to a backlog of 5)",
		fmt.Sprint(one.err), "0", one.err == 0)
	return nil
}

// measureColdBoot calls the scaled-to-zero project cold again and again:
// inferd's share is the call's latency less the model's own start and less a
// warm sync call. The model's own start is measured in the same loop by
// starting the same binary directly, from exec until it listens (which it
// logs): on a loaded machine a Go binary takes 15–30 ms from exec to main,
// which is the model's cost, not inferd's. The model prints a line once
// listening, as most servers do.
func measureColdBoot(ctx context.Context, e *env, o options, r *report) error {
	return coldBoot(ctx, e, o, r, "cold", e.coldLog, "")
}

// measureColdBootQuiet is measureColdBoot with a model that prints nothing,
// so only the health-check polling finds it ready.
func measureColdBootQuiet(ctx context.Context, e *env, o options, r *report) error {
	return coldBoot(ctx, e, o, r, "coldquiet", e.coldQuietLog, ", model printing nothing")
}

// measureColdBootSandboxOff is measureColdBoot with the replica sandbox off
// (models as root, on the host's network, in no cgroup of their own), after
// a restart of inferd, for the sandbox's share of a cold boot side by side;
// it restarts inferd with the sandbox on again at the end. It first records
// which protections the "on" figures had: all of them only as root.
func measureColdBootSandboxOff(ctx context.Context, e *env, o options, r *report) error {
	on, err := protectionsOn(ctx, e)
	if err != nil {
		return err
	}
	r.add("Replica sandbox in force for the figures above (docs/security.md)", on, "", true)
	if err := e.writeConfig(sandboxOff); err != nil {
		return err
	}
	if err := restartInferd(ctx, o, e); err != nil {
		return err
	}
	err = coldBoot(ctx, e, o, r, "cold", e.coldLog, ", sandbox off")
	if werr := e.writeConfig(sandboxOn); err == nil {
		err = werr
	}
	if rerr := restartInferd(ctx, o, e); err == nil {
		err = rerr
	}
	if err == nil && r.coldOn != 0 {
		r.add("Cold boot: the sandbox's share, p50 with it on − p50 with it off (same model, same loop)", dur(r.coldOn-r.coldOff), "", true)
	}
	return err
}

// protectionsOn names the protections /v1/status reports on.
func protectionsOn(ctx context.Context, e *env) (string, error) {
	req, err := http.NewRequestWithContext(ctx, "GET", e.base+"/v1/status", nil)
	if err != nil {
		return "", err
	}
	req.Header.Set("X-Service-API-Key", e.apiKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var st struct {
		Protections []struct {
			Name string `json:"name"`
			On   bool   `json:"on"`
		} `json:"protections"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil {
		return "", fmt.Errorf("/v1/status: %w", err)
	}
	var on, off []string
	for _, p := range st.Protections {
		if p.On {
			on = append(on, p.Name)
		} else {
			off = append(off, p.Name)
		}
	}
	s := "on: " + strings.Join(on, ", ")
	if len(off) > 0 {
		s += "; off: " + strings.Join(off, ", ")
	}
	return s, nil
}

func coldBoot(ctx context.Context, e *env, o options, r *report, project, bootLog, label string) error {
	const n = 20
	client := loadgen.NewClient(1)
	body := inferBody(e, "mk-"+project, false)
	var over, own, bootMs, inMain []time.Duration
	for range n {
		direct, err := directStart(ctx, e, o)
		if err != nil {
			return err
		}
		own = append(own, direct)
		if _, err := waitReplicas(ctx, e.base, project, "", 30*time.Second, func(v float64) bool { return v == 0 }); err != nil {
			return err
		}
		before, err := readBootLog(bootLog)
		if err != nil {
			return err
		}
		t := time.Now()
		a, err := loadgen.PostInference(ctx, client, e.base+"/start/v4", body)
		lat := time.Since(t)
		if err != nil {
			return err
		}
		after, err := readBootLog(bootLog)
		if err != nil {
			return err
		}
		if len(after) != len(before)+1 {
			return fmt.Errorf("expected one boot of the %s project, saw %d", project, len(after)-len(before))
		}
		b := after[len(after)-1]
		inMain = append(inMain, b.listening.Sub(b.started))
		over = append(over, lat-direct-r.warmStart)
		if a.BootMs != nil {
			bootMs = append(bootMs, time.Duration(*a.BootMs)*time.Millisecond-direct)
		}
		client.CloseIdleConnections()
	}
	slices.Sort(over)
	slices.Sort(own)
	slices.Sort(inMain)
	p50 := loadgen.Percentile(over, 50)
	switch label {
	case "":
		r.coldOn = p50
	case ", sandbox off":
		r.coldOff = p50
	}
	r.add(fmt.Sprintf("Cold boot overhead added by inferd%s, p50 (max) of %d: call latency − model's own start, exec to listening (p50 %s, of which in main %s) − warm sync call (%s)",
		label, n, dur(loadgen.Percentile(own, 50)), dur(loadgen.Percentile(inMain, 50)), dur(r.warmStart)),
		dur(p50)+" ("+dur(over[len(over)-1])+")", "≤ 20 ms", p50 <= 20*time.Millisecond)
	if len(bootMs) > 0 {
		slices.Sort(bootMs)
		r.add("Cold boot"+label+": the call's bootMs − model's own start, p50 (bootMs has 1 ms resolution)",
			dur(loadgen.Percentile(bootMs, 50)), "", true)
	}
	return nil
}

// directStart starts the no-op model the way a bare launcher would and
// returns the time from just before exec until it listened.
func directStart(ctx context.Context, e *env, o options) (time.Duration, error) {
	port, err := freePort()
	if err != nil {
		return 0, err
	}
	bootLog := filepath.Join(e.dir, "direct.boots")
	before, err := readBootLog(bootLog)
	if err != nil {
		return 0, err
	}
	t := time.Now()
	p, err := start("noop-direct", filepath.Join(e.dir, "noop-direct.log"),
		[]string{fmt.Sprintf("PORT=%d", port), "NOOP_BOOTLOG=" + bootLog}, o.noop)
	if err != nil {
		return 0, err
	}
	defer p.stop()
	deadline := time.Now().Add(10 * time.Second)
	for {
		after, err := readBootLog(bootLog)
		if err != nil {
			return 0, err
		}
		if len(after) > len(before) {
			return after[len(after)-1].listening.Sub(t), nil
		}
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("the no-op model started directly did not listen within 10s")
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(time.Millisecond):
		}
	}
}

// measureBurst sends 16 calls at once at a scaled-to-zero project with up to
// 4 replicas of a 200 ms model, and reads when each replica process started
// and became ready.
func measureBurst(ctx context.Context, e *env, o options, r *report) error {
	const calls, replicas = 16, 4
	if _, err := waitReplicas(ctx, e.base, "burst", "", 30*time.Second, func(v float64) bool { return v == 0 }); err != nil {
		return err
	}
	client := loadgen.NewClient(calls)
	body := inferBody(e, "mk-burst", false)
	t0 := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, calls)
	for range calls {
		wg.Go(func() {
			if _, err := loadgen.PostInference(ctx, client, e.base+"/start/v4", body); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	total := time.Since(t0)
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	boots, err := readBootLog(e.burstLog)
	if err != nil {
		return err
	}
	if len(boots) != replicas {
		return fmt.Errorf("burst booted %d replicas, want %d", len(boots), replicas)
	}
	var lastStart, lastReady time.Time
	for _, b := range boots {
		lastStart = maxTime(lastStart, b.started)
		lastReady = maxTime(lastReady, b.listening)
	}
	r.add(fmt.Sprintf("Scale-up under a burst (%d calls at once, 0 → %d replicas): until all %d model processes ran / were listening",
		calls, replicas, replicas), dur(lastStart.Sub(t0))+" / "+dur(lastReady.Sub(t0)), "", true)
	r.add(fmt.Sprintf("Scale-up under a burst: all %d calls of 200 ms answered (ideal with %d replicas: %s + boot)",
		calls, replicas, dur(calls/replicas*200*time.Millisecond)), dur(total), "", true)
	return nil
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// measureFill stores finished calls (sync starts on the no-op model) until
// there are o.fill, then reads RSS and the data file's size.
func measureFill(ctx context.Context, e *env, o options, r *report) error {
	have, err := metricSum(ctx, e.base, `inferd_calls_total{`)
	if err != nil {
		return err
	}
	size0 := diskBytes(e.dbPath)
	n := o.fill - int(have)
	if n > 0 {
		res, err := loadgen.Run(ctx, loadgen.Config{Target: loadgen.Start, URL: e.base, APIKey: e.apiKey,
			ModelKey: "mk-noop", Concurrency: 64, Count: n})
		if err != nil {
			return err
		}
		if res.Errors > 0 {
			return fmt.Errorf("fill: %d errors, first: %s", res.Errors, res.FirstError)
		}
		r.add(fmt.Sprintf("Fill: %d sync starts at c=64 (throughput)", n), fmt.Sprintf("%.0f calls/s", res.Throughput), "", true)
	}
	total, err := metricSum(ctx, e.base, `inferd_calls_total{`)
	if err != nil {
		return err
	}
	rss, err := rssBytes(e.inferdPid)
	if err != nil {
		return err
	}
	r.add("RSS right after storing them (over idle; the heap the load grew is not yet returned to the OS, and bbolt's mmap holds the pages it wrote)",
		mib(rss)+" (+"+mib(rss-r.idleRSS)+")", "", true)
	// What a user sees: the same daemon with the calls in its file, idle. The
	// idle figure was taken the same way, with an empty file.
	if err := restartInferd(ctx, o, e); err != nil {
		return err
	}
	if rss, err = rssBytes(e.inferdPid); err != nil {
		return err
	}
	added := rss - r.idleRSS
	r.add(fmt.Sprintf("RSS idle after a restart with %.0f finished calls stored (added over idle with an empty file)", total),
		mib(rss)+" (+"+mib(added)+")", "≤ +30 MB", added <= 30<<20)
	if n > 0 {
		per := float64(diskBytes(e.dbPath)-size0) / float64(n)
		r.add(fmt.Sprintf("Data file growth on disk per call (%d calls, inputs %s, outputs {\"ok\":true}); file %s on disk",
			n, `{"prompt":"hello"}`, mib(diskBytes(e.dbPath))), fmt.Sprintf("%.0f bytes", per), "", true)
	} else if total > 0 {
		// The steps before already stored more than -fill calls (a full run):
		// the file over every call in it, the fill's own growth unmeasured.
		r.add(fmt.Sprintf("Data file on disk per stored call (%.0f calls of the steps above, mostly sync starts with tiny inputs); file %s on disk",
			total, mib(diskBytes(e.dbPath))), fmt.Sprintf("%.0f bytes", float64(diskBytes(e.dbPath))/total), "", true)
	}
	return nil
}

// measureLongPolls starts o.polls calls on a model that never answers and
// holds one long-poll check on each at once.
func measureLongPolls(ctx context.Context, e *env, o options, r *report) error {
	ids, err := startCalls(ctx, e, "mk-hang", o.polls)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// One connection per poll; at most 256 dials in flight, so the listen
	// backlog never overflows into SYN retries.
	client := &http.Client{Transport: &http.Transport{Proxy: nil, MaxIdleConnsPerHost: -1}}
	sem := make(chan struct{}, 256)
	var wg sync.WaitGroup
	var early atomic.Int64
	for _, id := range ids {
		sem <- struct{}{}
		wg.Go(func() {
			var once sync.Once
			release := func() { once.Do(func() { <-sem }) }
			defer release()
			trace := &httptrace.ClientTrace{WroteRequest: func(httptrace.WroteRequestInfo) { release() }}
			b, _ := json.Marshal(map[string]any{"apiKey": e.apiKey, "callID": id, "longPoll": true})
			if _, err := loadgen.Post(httptrace.WithClientTrace(pctx, trace), client, e.base+"/check/v4", b); err == nil {
				early.Add(1) // answered before we let go: not held
			}
		})
	}
	held, err := waitMetric(ctx, e.base, "inferd_longpolls_in_flight", 120*time.Second,
		func(v float64) bool { return v >= float64(o.polls) })
	if err != nil {
		cancel()
		wg.Wait()
		return err
	}
	rss, err := rssBytes(e.inferdPid)
	cancel()
	wg.Wait()
	if err != nil {
		return err
	}
	if early.Load() > 0 {
		return fmt.Errorf("%d long polls answered before the end", early.Load())
	}
	r.add(fmt.Sprintf("RSS with %.0f long polls held at once (and %d queued calls)", held, len(ids)), mib(rss), "≤ 300 MB", rss <= 300<<20)
	return nil
}

// startCalls starts n calls with startOnly and returns their ids.
func startCalls(ctx context.Context, e *env, modelKey string, n int) ([]string, error) {
	client := loadgen.NewClient(64)
	body := inferBody(e, modelKey, true)
	ids := make([]string, n)
	var next atomic.Int64
	var firstErr error
	var mu sync.Mutex
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n {
					return
				}
				a, err := loadgen.PostInference(ctx, client, e.base+"/start/v4", body)
				if err != nil {
					mu.Lock()
					firstErr = err
					mu.Unlock()
					return
				}
				ids[i] = a.CallID
			}
		})
	}
	wg.Wait()
	return ids, firstErr
}

func inferBody(e *env, modelKey string, startOnly bool) []byte {
	b, _ := json.Marshal(map[string]any{"apiKey": e.apiKey, "modelKey": modelKey,
		"modelInputs": map[string]string{"prompt": "hello"}, "startOnly": startOnly})
	return b
}

func hostname() string {
	h, _ := os.Hostname()
	return h
}
