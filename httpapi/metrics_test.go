package httpapi

import (
	"bufio"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	vm "github.com/VictoriaMetrics/metrics"

	"inferd/gpu"
	"inferd/scheduler"
	"inferd/store"
)

// parseExposition reads `name{labels} value` lines into a map keyed by
// `name{labels}` as written; comments and blank lines are skipped.
func parseExposition(t *testing.T, text string) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			t.Fatalf("bad exposition line %q", line)
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			t.Fatalf("bad value in %q: %v", line, err)
		}
		out[line[:i]] = v
	}
	return out
}

type fakeStoreStats struct{}

func (fakeStoreStats) CommitStats() store.CommitStats {
	return store.CommitStats{Commits: 7, Writes: 9, Duration: 1500 * time.Millisecond}
}
func (fakeStoreStats) Size() int64 { return 32768 }

func TestMetricsEndpoint(t *testing.T) {
	m := NewMetrics(vm.NewSet())
	m.SetSources(MetricsSources{
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
	})
	e := newEnv(t, Options{Metrics: m})

	now := time.Now()
	m.CallFinished(store.Call{ProjectID: "echo", State: store.CallSucceeded, Dispatched: now, QueueMs: 20, BootMs: 1500, RunMs: 250})
	m.CallFinished(store.Call{ProjectID: "echo", State: store.CallFailed, Dispatched: now, RunMs: 10})
	m.CallFinished(store.Call{ProjectID: "echo", State: store.CallFailed}) // never dispatched: no timings
	m.ReplicaStarted("echo")
	m.ReplicaStarted("echo")
	m.ReplicaCrashed("echo")
	m.ReplicaEvicted(`we"ird`)

	for _, p := range []string{"/healthz", "/healthz", "/v1/projects/echo", "/nope"} {
		serve(e.h, "GET", p, "")
	}
	rec := serve(e.h, "GET", "/metrics", "")
	if rec.Code != http.StatusOK || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/plain") {
		t.Fatalf("GET /metrics: %d %q", rec.Code, rec.Header().Get("Content-Type"))
	}
	got := parseExposition(t, rec.Body.String())
	want := map[string]float64{
		`inferd_calls_total{project="echo",outcome="succeeded"}`:            1,
		`inferd_calls_total{project="echo",outcome="failed"}`:               2,
		`inferd_call_run_seconds_count{project="echo"}`:                     2,
		`inferd_call_run_seconds_sum{project="echo"}`:                       0.26,
		`inferd_call_boot_seconds_sum{project="echo"}`:                      1.5,
		`inferd_call_queue_seconds_bucket{project="echo",le="0.025"}`:       2, // cumulative: both dispatched calls
		`inferd_replica_starts_total{project="echo"}`:                       2,
		`inferd_replica_crashes_total{project="echo"}`:                      1,
		`inferd_replica_evictions_total{project="we\"ird"}`:                 1,
		`inferd_queue_depth{project="echo"}`:                                3,
		`inferd_replicas{project="echo",state="busy"}`:                      2,
		`inferd_replicas{project="echo",state="booting"}`:                   1,
		`inferd_replicas{project="echo",state="ready"}`:                     0,
		`inferd_gpu_memory_total_bytes{gpu="0",uuid="GPU-a"}`:               1024 << 20,
		`inferd_gpu_memory_used_bytes{gpu="0",uuid="GPU-a"}`:                768 << 20, // the driver's view
		`inferd_gpu_memory_reserved_bytes{gpu="0",uuid="GPU-a"}`:            512 << 20,
		`inferd_gpu_memory_used_bytes{gpu="1",uuid="GPU-sim"}`:              300 << 20, // no driver: the reservation
		`inferd_gpu_memory_reserved_bytes{gpu="1",uuid="GPU-sim"}`:          300 << 20,
		`inferd_gpu_utilization_ratio{gpu="1",uuid="GPU-sim"}`:              0,
		`inferd_gpu_utilization_ratio{gpu="0",uuid="GPU-a"}`:                0.4,
		`inferd_gpu_healthy{gpu="0",uuid="GPU-a"}`:                          1,
		`inferd_gpu_healthy{gpu="1",uuid="GPU-sim"}`:                        1,
		`inferd_gpu_healthy{gpu="2",uuid="GPU-lost"}`:                       0,
		`inferd_store_file_bytes`:                                           32768,
		`inferd_store_commits_total`:                                        7,
		`inferd_store_commit_seconds_total`:                                 1.5,
		`inferd_http_requests_total{route="/healthz",status="200"}`:         2,
		`inferd_http_requests_total{route="/v1/projects/:id",status="401"}`: 1,
		`inferd_http_requests_total{route="unmatched",status="404"}`:        1,
		`inferd_longpolls_in_flight`:                                        0,
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
	m := NewMetrics(vm.NewSet())
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

func scrape(m *Metrics) string {
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
