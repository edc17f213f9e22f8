package e2e

import (
	"bytes"
	"os/exec"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// scrapeMetrics GETs /metrics (no API key) and parses the exposition text:
// `name{labels} value` lines, keyed by `name{labels}` as written.
func scrapeMetrics(t *testing.T, base string) map[string]float64 {
	t.Helper()
	return parseMetrics(t, scrapeRaw(t, base))
}

// scrapeRaw GETs /metrics and returns the exposition text as served.
func scrapeRaw(t *testing.T, base string) []byte {
	t.Helper()
	status, body := doRaw(t, "GET", base+"/metrics", nil, "")
	if status != 200 {
		t.Fatalf("GET /metrics answered HTTP %d: %s", status, body)
	}
	return body
}

func parseMetrics(t *testing.T, body []byte) map[string]float64 {
	t.Helper()
	m, err := testenv.ParseMetrics(body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return m
}

func TestMetricsEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\nlongPollWait: 5s\n")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, mark, "") + "    idleTimeout: 300\n")
	c := inferenceClient{t: t, base: d.base, key: key}

	before := scrapeMetrics(t, d.base)
	if r := c.start("mk-echo", `{"prompt":"hi"}`, false); r["message"] != "success" {
		t.Fatalf("want success, got %v", r)
	}
	if r := c.start("mk-echo", `{"fail":"x"}`, false); !strings.Contains(r["message"].(string), "error") {
		t.Fatalf("want an error, got %v", r)
	}
	// The queue depth and replica gauges read the scheduler at scrape time.
	var after map[string]float64
	eventually(t, 10*time.Second, "both calls counted", func() bool {
		after = scrapeMetrics(t, d.base)
		return after[`inferd_calls_total{project="echo",outcome="failed"}`] >= 1
	})

	grew := func(name string, by float64) {
		t.Helper()
		if got := after[name] - before[name]; got < by {
			t.Errorf("%s went from %v to %v, want +%v", name, before[name], after[name], by)
		}
	}
	grew(`inferd_calls_total{project="echo",outcome="succeeded"}`, 1)
	grew(`inferd_calls_total{project="echo",outcome="failed"}`, 1)
	grew(`inferd_call_run_seconds_count{project="echo"}`, 2)
	grew(`inferd_call_boot_seconds_count{project="echo"}`, 2)
	grew(`inferd_replica_starts_total{project="echo"}`, 1)
	grew(`inferd_http_requests_total{route="/start/v4",status="200"}`, 2)
	grew(`inferd_http_requests_total{route="/metrics",status="200"}`, 1)
	grew(`inferd_store_commits_total`, 1)
	if after["inferd_store_file_bytes"] <= 0 {
		t.Errorf("inferd_store_file_bytes = %v", after["inferd_store_file_bytes"])
	}
	if _, ok := after[`inferd_queue_depth{project="echo"}`]; !ok {
		t.Errorf("no inferd_queue_depth for echo")
	}
	live := 0.0
	for _, s := range []string{"booting", "ready", "busy", "stopping"} {
		live += after[`inferd_replicas{project="echo",state="`+s+`"}`]
	}
	if live < 1 {
		t.Errorf("no echo replica in inferd_replicas right after two calls")
	}
	if _, ok := after["inferd_longpolls_in_flight"]; !ok {
		t.Errorf("no inferd_longpolls_in_flight")
	}
}

// TestMetricsDuringLoad scrapes while calls are queued and long polls wait,
// on a box with two simulated GPUs that two projects compete for: each
// gauge moves while the load is on and each counter has grown after it.
func TestMetricsDuringLoad(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(30*time.Second)+"\nlongPollWait: "+scaledSetting(30*time.Second)+"\ngpu:\n  simulate:\n"+
		"    - {name: \"Sim A\", memoryMiB: 1024}\n    - {name: \"Sim B\", memoryMiB: 2048}\n")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" +
		echoProject("slow", "acme", "mk-slow", echo, mark, "") + "    gpus: 2\n    maxReplicas: 1\n    idleTimeout: 300\n" +
		echoProject("other", "acme", "mk-other", echo, mark, "") + "    gpus: 1\n    maxReplicas: 1\n")
	c := inferenceClient{t: t, base: d.base, key: key}
	before := scrapeMetrics(t, d.base)
	if before[`inferd_gpu_memory_total_bytes{gpu="1",uuid="GPU-sim-0001-0000-0000-000000000001"}`] != 2048<<20 {
		t.Errorf("GPU memory total not reported: %v", before)
	}
	if _, ok := before[`inferd_gpu_utilization_ratio{gpu="0",uuid="GPU-sim-0000-0000-0000-000000000000"}`]; !ok {
		t.Errorf("no GPU utilization gauge")
	}

	// Load: three slow calls on a one-replica project (two wait in its
	// queue), each with a long poll waiting on it.
	var ids []string
	for range 3 {
		ids = append(ids, c.start("mk-slow", sleepInputs(3*time.Second), true)["callID"].(string))
	}
	// Each poll reports its error on the channel: t.Fatal is for the test's
	// goroutine only, and a poll that ended without sending would hang the test.
	polls := make(chan error, len(ids))
	for _, id := range ids {
		go func() {
			_, _, err := tryDo("POST", d.base+"/check/v4", nil, `{"apiKey":"`+key+`","callID":"`+id+`","longPoll":true}`)
			polls <- err
		}()
	}
	var during map[string]float64
	var duringRaw []byte
	eventually(t, 30*time.Second, "queue depth, busy replica and long polls seen in one scrape", func() bool {
		duringRaw = scrapeRaw(t, d.base)
		during = parseMetrics(t, duringRaw)
		return during[`inferd_queue_depth{project="slow"}`] >= 1 &&
			during[`inferd_replicas{project="slow",state="busy"}`] == 1 &&
			during["inferd_longpolls_in_flight"] >= 1
	})
	for range ids {
		if err := <-polls; err != nil {
			t.Errorf("long poll: %v", err)
		}
	}
	// The slow replica holds both GPUs and is idle now: a call of another
	// project evicts it.
	if r := c.start("mk-other", `{"x":1}`, false); r["message"] != "success" {
		t.Fatalf("call of other: %v", r)
	}
	// And a crash is counted.
	c.start("mk-other", `{"crash":true}`, false)
	var after map[string]float64
	eventually(t, 30*time.Second, "long polls drained and the crash counted", func() bool {
		after = scrapeMetrics(t, d.base)
		return after["inferd_longpolls_in_flight"] == 0 && after[`inferd_replica_crashes_total{project="other"}`] >= 1
	})
	grew := func(name string, by float64) {
		t.Helper()
		if got := after[name] - before[name]; got < by {
			t.Errorf("%s went from %v to %v, want +%v", name, before[name], after[name], by)
		}
	}
	grew(`inferd_calls_total{project="slow",outcome="succeeded"}`, 3)
	grew(`inferd_call_queue_seconds_count{project="slow"}`, 3)
	grew(`inferd_call_run_seconds_sum{project="slow"}`, 9) // three sleeps of 3 s or more
	grew(`inferd_replica_evictions_total{project="slow"}`, 1)
	grew(`inferd_replica_starts_total{project="other"}`, 1)
	grew(`inferd_http_requests_total{route="/check/v4",status="200"}`, 3)
	grew(`inferd_store_commit_seconds_total`, 1e-9)
	if after[`inferd_queue_depth{project="slow"}`] != 0 {
		t.Errorf("queue depth after the load: %v", after[`inferd_queue_depth{project="slow"}`])
	}
	// The scrape taken under load (a queue, a busy replica, long polls, GPU
	// gauges, every histogram) passes Prometheus' own checker, lint included:
	// # HELP and # TYPE for every family, names and units as it expects.
	promtoolCheck(t, duringRaw)
}

// promtoolCheck runs `promtool check metrics` (Debian's prometheus package,
// which scripts/test-deps.sh installs) on an exposition text. Without
// promtool the test is skipped, after everything else in it has run, or
// fails under make test (testenv.Missing).
func promtoolCheck(t *testing.T, exposition []byte) {
	t.Helper()
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		testenv.Missing(t, "promtool (Debian package prometheus; make test installs it)")
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = bytes.NewReader(exposition)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("promtool check metrics: %v\n%s\non this scrape:\n%s", err, out, exposition)
	}
}
