package httpapi

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"inferd/gpu"
	"inferd/httpapi/metrics"
	"inferd/internal/testenv"
	"inferd/scheduler"
	"inferd/store"
	"inferd/webhook"
)

// parseExposition reads an exposition text (testenv.ParseMetrics).
func parseExposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	m, err := testenv.ParseMetrics([]byte(text))
	if err != nil {
		t.Fatal(err)
	}
	return m
}

type fakeStoreStats struct{}

func (fakeStoreStats) CommitStats() store.CommitStats {
	return store.CommitStats{Commits: 7, Writes: 9, Duration: 1500 * time.Millisecond}
}
func (fakeStoreStats) Size() int64 { return 32768 }

// loadedMetrics returns Metrics with a scheduler, two GPUs (one simulated)
// and a store behind them, and a few calls and replica events recorded.
func loadedMetrics() *metrics.Metrics { return loadedMetricsWith(nil) }

// loadedMetricsWith is loadedMetrics on a node of cluster c (nil: a
// single box).
func loadedMetricsWith(c metrics.Cluster) *metrics.Metrics {
	m := metrics.New(vm.NewSet())
	m.SetSources(metrics.Sources{
		Cluster: c,
		Status: func() scheduler.Status {
			return scheduler.Status{Projects: []scheduler.ProjectStatus{{
				ID: "echo", Queued: 3,
				Replicas: []scheduler.ReplicaStatus{{State: "busy"}, {State: "busy"}, {State: "booting"}},
			}}, GPUs: []scheduler.GPUStatus{{UUID: "GPU-a", ReservedMiB: 512}, {UUID: "GPU-sim", ReservedMiB: 300}}}
		},
		GPUs: func() []gpu.Device {
			return []gpu.Device{
				{Index: 0, UUID: "GPU-a", MemoryTotalMiB: 1024, MemoryFreeMiB: 256, UtilizationPct: 40},
				{Index: 1, UUID: "GPU-sim", MemoryTotalMiB: 2048, MemoryFreeMiB: 2048, Simulated: true},
				{Index: 2, UUID: "GPU-lost", MemoryTotalMiB: 2048, Problem: "lost (ERROR_GPU_IS_LOST)"},
			}
		},
		Store: fakeStoreStats{},
		Conns: func() metrics.ConnStats { return metrics.ConnStats{Open: 5, Max: 100, Shed: 2} },
		Webhooks: func() map[string]webhook.Stats {
			return map[string]webhook.Stats{
				"acme": {Delivered: 4, Retries: 2, GaveUp: 1, Dropped: 6, Pending: 3, Sending: 2},
				"beta": {Delivered: 1},
			}
		},
	})
	now := time.Now()
	m.CallFinished(store.Call{ProjectID: "echo", State: store.CallSucceeded, Created: now.Add(-1770 * time.Millisecond),
		Dispatched: now.Add(-250 * time.Millisecond), Finished: now, QueueMs: 20, BootMs: 1500, RunMs: 250})
	m.CallFinished(store.Call{ProjectID: "echo", State: store.CallFailed, Created: now.Add(-10 * time.Millisecond),
		Dispatched: now.Add(-10 * time.Millisecond), Finished: now, RunMs: 10})
	m.CallFinished(store.Call{ProjectID: "llm", TeamID: "acme", State: store.CallSucceeded, Created: now, Finished: now,
		Tokens: &store.Tokens{Prompt: 12, Completion: 30}})
	m.CallFinished(store.Call{ProjectID: "llm", TeamID: "acme", State: store.CallSucceeded, Created: now, Finished: now,
		Tokens: &store.Tokens{Prompt: 3, Completion: 5}})
	cpu, joules := 0.5, 12.5
	m.CallFinished(store.Call{ProjectID: "metered", TeamID: "acme", State: store.CallSucceeded,
		Usage: &store.CallUsage{ReplicaSeconds: 1.5, GPUSeconds: 0.75, CPUSeconds: &cpu, BytesIn: 10, BytesOut: 20, EnergyJoules: &joules}})
	m.ReplicaUsage([]store.UsageRow{{TeamID: "acme", ProjectID: "metered", UsageTotals: store.UsageTotals{BootReplicaSeconds: 4, IdleReplicaSeconds: 30, BootGPUSeconds: 2, IdleGPUSeconds: 15}}})
	// Never dispatched: a latency but no queue, boot or run time.
	m.CallFinished(store.Call{ProjectID: "echo", State: store.CallFailed, Created: now.Add(-2 * time.Second), Finished: now})
	m.ReplicaStarted("echo")
	m.ReplicaStarted("echo")
	m.ReplicaCrashed("echo")
	m.ReplicaOOMKilled("echo")
	m.ReplicaEvicted(`we"ird`)
	m.CallCancelled("echo")
	m.CallExpired("echo")
	m.CallRetried("echo")
	m.BatchDispatched("echo", 16, 3*time.Millisecond)
	m.BatchDispatched("echo", 5, 0)
	m.ReplicaParked("echo", 1500*time.Millisecond)
	m.ReplicaRestored("echo", 400*time.Millisecond)
	m.ParkFailed("echo")
	m.RestoreFailed("echo", scheduler.RestoreGPUTaken)
	return m
}

func TestMetricsEndpoint(t *testing.T) {
	m := loadedMetrics()
	e := newEnv(t, Options{Metrics: m})

	for _, p := range []string{"/healthz", "/healthz", "/v1/projects/echo", "/nope"} {
		serve(e.h, "GET", p, "")
	}
	rec := serve(e.h, "GET", "/metrics", "")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	got := parseExposition(t, rec.Body.String())
	want := map[string]float64{
		`inferd_calls_total{project="echo",outcome="succeeded"}`:               1,
		`inferd_calls_total{project="echo",outcome="failed"}`:                  2,
		`inferd_call_seconds_count{project="echo",outcome="failed"}`:           2,
		`inferd_call_seconds_sum{project="echo",outcome="succeeded"}`:          1.77,
		`inferd_call_seconds_bucket{project="echo",outcome="failed",le="2.5"}`: 2,
		`inferd_call_seconds_bucket{project="echo",outcome="failed",le="1"}`:   1,
		`inferd_call_run_seconds_count{project="echo"}`:                        2,
		`inferd_call_run_seconds_sum{project="echo"}`:                          0.26,
		`inferd_call_boot_seconds_sum{project="echo"}`:                         1.5,
		`inferd_call_queue_seconds_bucket{project="echo",le="0.025"}`:          2, // cumulative: both dispatched calls
		`inferd_batch_size_count{project="echo"}`:                              2,
		`inferd_batch_size_sum{project="echo"}`:                                21,
		`inferd_batch_size_bucket{project="echo",le="8"}`:                      1,
		`inferd_batch_wait_seconds_sum{project="echo"}`:                        0.003,
		`inferd_batch_wait_seconds_bucket{project="echo",le="0.001"}`:          1,
		`inferd_replica_starts_total{project="echo"}`:                          2,
		`inferd_tokens_total{team="acme",project="llm",kind="prompt"}`:         15,
		`inferd_tokens_total{team="acme",project="llm",kind="completion"}`:     35,
		`inferd_replica_crashes_total{project="echo"}`:                         1,
		`inferd_replica_oom_kills_total{project="echo"}`:                       1,
		`inferd_replica_evictions_total{project="we\"ird"}`:                    1,
		`inferd_queue_depth{project="echo"}`:                                   3,
		`inferd_replicas{project="echo",state="busy"}`:                         2,
		`inferd_replicas{project="echo",state="booting"}`:                      1,
		`inferd_replicas{project="echo",state="ready"}`:                        0,
		`inferd_gpu_memory_total_bytes{gpu="0",uuid="GPU-a"}`:                  1024 << 20,
		`inferd_gpu_memory_used_bytes{gpu="0",uuid="GPU-a"}`:                   768 << 20, // the driver's view
		`inferd_gpu_memory_reserved_bytes{gpu="0",uuid="GPU-a"}`:               512 << 20,
		`inferd_gpu_memory_used_bytes{gpu="1",uuid="GPU-sim"}`:                 300 << 20, // no driver: the reservation
		`inferd_gpu_memory_reserved_bytes{gpu="1",uuid="GPU-sim"}`:             300 << 20,
		`inferd_gpu_utilization_ratio{gpu="1",uuid="GPU-sim"}`:                 0,
		`inferd_gpu_utilization_ratio{gpu="0",uuid="GPU-a"}`:                   0.4,
		`inferd_gpu_healthy{gpu="0",uuid="GPU-a"}`:                             1,
		`inferd_gpu_healthy{gpu="1",uuid="GPU-sim"}`:                           1,
		`inferd_gpu_healthy{gpu="2",uuid="GPU-lost"}`:                          0,
		`inferd_store_file_bytes`:                                              32768,
		`inferd_store_commits_total`:                                           7,
		`inferd_store_commit_seconds_total`:                                    1.5,
		`inferd_http_requests_total{route="/healthz",status="200"}`:            2,
		`inferd_http_requests_total{route="/v1/projects/:id",status="401"}`:    1,
		`inferd_http_requests_total{route="unmatched",status="404"}`:           1,
		`inferd_longpolls_in_flight`:                                           0,
		`inferd_connections_open`:                                              5,
		`inferd_connections_max`:                                               100,
		`inferd_connections_closed_for_room_total`:                             2,
	}
	for k, v := range want {
		g, ok := got[k]
		if !ok {
			t.Errorf("missing %s in:\n%s", k, rec.Body.String())
			continue
		}
		if d := g - v; d > 1e-9 || d < -1e-9 {
			t.Errorf("%s = %v, want %v", k, g, v)
		}
	}
	// The scrape itself is counted once answered: it shows in the next one.
	got = parseExposition(t, serve(e.h, "GET", "/metrics", "").Body.String())
	if got[`inferd_http_requests_total{route="/metrics",status="200"}`] != 1 {
		t.Errorf("the first scrape was not counted")
	}
}

// TestMetricsLongPollsInFlight counts only checks that wait for their call:
// a plain check and a long poll on a finished call answer at once.
func TestMetricsLongPollsInFlight(t *testing.T) {
	m := metrics.New(vm.NewSet())
	env := newEnv(t, Options{LongPollWait: time.Hour, Metrics: m})
	env.sched.add(store.Call{ID: "c1", TeamID: "acme", State: store.CallRunning})
	env.sched.add(store.Call{ID: "c2", TeamID: "acme", State: store.CallSucceeded})
	inFlight := func() float64 { return parseExposition(t, scrape(m))["inferd_longpolls_in_flight"] }

	serve(env.h, "POST", "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "c1"}`)
	serve(env.h, "POST", "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "c2", "longPoll": true}`)
	if got := inFlight(); got != 0 {
		t.Fatalf("in flight after checks that answered at once = %v, want 0", got)
	}
	res := serveAsync(env.h, "POST", "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "c1", "longPoll": true}`)
	eventuallyTrue(t, func() bool { return inFlight() == 1 })
	env.sched.finish("c1", store.CallSucceeded, `{}`, "success")
	waitResult(t, res)
	if got := inFlight(); got != 0 {
		t.Errorf("in flight after the long poll answered = %v, want 0", got)
	}
}

func scrape(m *metrics.Metrics) string {
	var b strings.Builder
	m.WritePrometheus(&b)
	return b.String()
}

func TestMetricsOff(t *testing.T) {
	e := newEnv(t, Options{})
	if rec := serve(e.h, "GET", "/metrics", ""); rec.Code != http.StatusNotFound {
		t.Fatalf("GET /metrics without Metrics: %d, want 404", rec.Code)
	}
}

// TestMetricsHaveHelpAndType checks the exposition's shape the way
// promtool does: every family has one # HELP with text and one # TYPE, and
// all its samples follow them together; and docs/metrics.md describes each
// family with its labels. It scrapes a node in cluster mode, which writes
// every family (the cluster ones too) with a node label on each sample.
func TestMetricsHaveHelpAndType(t *testing.T) {
	m := loadedMetricsIn(twoNodeCluster())
	e := newEnv(t, Options{Metrics: m})
	serve(e.h, "GET", "/healthz", "")
	text := serve(e.h, "GET", "/metrics", "").Body.String()

	help, typ := map[string]string{}, map[string]string{}
	current := ""
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" {
			name := f[2]
			switch f[1] {
			case "HELP":
				if _, dup := help[name]; dup {
					t.Errorf("second HELP for %s", name)
				}
				help[name] = strings.Join(f[3:], " ")
			case "TYPE":
				if _, dup := typ[name]; dup {
					t.Errorf("second TYPE for %s", name)
				}
				typ[name] = f[3]
				current = name
			}
			continue
		}
		name := line[:strings.IndexAny(line, "{ ")]
		if typ[current] == "histogram" {
			for _, s := range []string{"_bucket", "_sum", "_count"} {
				if b, ok := strings.CutSuffix(name, s); ok && b == current {
					name = current
				}
			}
		}
		if name != current {
			t.Errorf("sample %q is not under its family's # TYPE (current family %q)", line, current)
		}
	}
	docs, err := os.ReadFile("../docs/metrics.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range metrics.Families() {
		if typ[f.Name] != f.Type || help[f.Name] == "" {
			t.Errorf("%s: TYPE %q HELP %q, want TYPE %s and a help text", f.Name, typ[f.Name], help[f.Name], f.Type)
		}
		// docs/metrics.md has one table row per family: name, type, labels.
		row := fmt.Sprintf("| `%s` | %s | %s |", f.Name, f.Type, docLabels(f.Labels))
		if !strings.Contains(string(docs), row) {
			t.Errorf("docs/metrics.md lacks the row %q", row)
		}
	}
	for name, ty := range typ {
		if ty == "untyped" {
			t.Errorf("%s is written but not in metricFamilies", name)
		}
	}
}

func docLabels(labels []string) string {
	if len(labels) == 0 {
		return "–"
	}
	return "`" + strings.Join(labels, "`, `") + "`"
}

func TestUsageCountersFollowTheLedger(t *testing.T) {
	text := scrape(loadedMetrics())
	for _, want := range []string{
		`inferd_usage_calls_total{team="acme",project="metered"} 1`,
		`inferd_usage_replica_seconds_total{team="acme",project="metered",phase="call"} 1.5`,
		`inferd_usage_replica_seconds_total{team="acme",project="metered",phase="boot"} 4`,
		`inferd_usage_replica_seconds_total{team="acme",project="metered",phase="idle"} 30`,
		`inferd_usage_gpu_seconds_total{team="acme",project="metered",phase="idle"} 15`,
		`inferd_usage_cpu_seconds_total{team="acme",project="metered"} 0.5`,
		`inferd_usage_bytes_total{team="acme",project="metered",direction="out"} 20`,
		`inferd_usage_energy_joules_total{team="acme",project="metered"} 12.5`,
	} {
		if !strings.Contains(text, want+"\n") {
			t.Errorf("scrape lacks %s", want)
		}
	}
	// A call without measures adds no CPU or energy sample: absent, not 0.
	m := metrics.New(vm.NewSet())
	m.CallFinished(store.Call{ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Usage: &store.CallUsage{ReplicaSeconds: 1}})
	if text := scrape(m); strings.Contains(text, "inferd_usage_energy_joules_total") || strings.Contains(text, "inferd_usage_cpu_seconds_total") {
		t.Errorf("unmeasured energy or CPU written: %s", text)
	}
}
