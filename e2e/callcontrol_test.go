package e2e

// Call control end to end: cancel, purge, queueTimeout, priorities,
// idempotency keys, retries and warm-up, over real HTTP with the echo model,
// each across a kill -9 of the daemon where it applies.

import (
	"fmt"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/store"
)

// callControlDaemon starts a daemon with a key for team acme and the echo
// projects of manifest (entries from echoProject) applied.
func callControlDaemon(t *testing.T, extraConfig, manifest string) (*daemon, inferenceClient, string) {
	t.Helper()
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\nlongPollWait: "+scaledSetting(10*time.Second)+"\nreplica:\n  stopGrace: 2s\n  restartBackoff: 100ms\n"+extraConfig)
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + manifest)
	return d, inferenceClient{t: t, base: d.base, key: key}, key
}

// restart kills the daemon with SIGKILL and starts it again on the same
// data; the client is pointed at the new one.
func (d *daemon) restartAfterKill(t *testing.T, c *inferenceClient) *daemon {
	t.Helper()
	d.kill()
	nd := startDaemon(t, d.dir, d.cfgPath)
	c.base = nd.base
	return nd
}

// post sends an inference-shaped request (cancel) and returns the answer.
func (c inferenceClient) post(path, body string) map[string]any {
	c.t.Helper()
	status, obj := do(c.t, "POST", c.base+path, nil, body)
	if status != 200 {
		c.t.Fatalf("%s answered HTTP %d: %v", path, status, obj)
	}
	checkEnvelope(c.t, obj)
	return obj
}

func (c inferenceClient) cancel(callID string) map[string]any {
	c.t.Helper()
	return c.post("/cancel/v4", fmt.Sprintf(`{"apiKey":%q,"callID":%q}`, c.key, callID))
}

// startWith starts a call with extra start fields (a JSON fragment).
func (c inferenceClient) startWith(modelKey, inputs, extra string) map[string]any {
	c.t.Helper()
	return c.post("/start/v4", fmt.Sprintf(`{"apiKey":%q,"modelKey":%q,"modelInputs":%s%s}`, c.key, modelKey, inputs, extra))
}

func (c inferenceClient) waitState(callID, state string) {
	c.t.Helper()
	eventually(c.t, time.Minute, "call "+callID+" "+state, func() bool { return c.check(callID, false)["message"] == state })
}

// metric returns the value of one sample of /metrics, as Prometheus writes
// it, "0" if absent.
func (d *daemon) metric(t *testing.T, sample string) string {
	t.Helper()
	return strconv.FormatFloat(scrapeMetrics(t, d.base)[sample], 'g', -1, 64)
}

func TestCancelEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	mark := marker()
	d, c, _ := callControlDaemon(t, "", echoProject("slow", "acme", "mk-slow", echo, mark, "")+"    minReplicas: 1\n    maxReplicas: 1\n")
	eventually(t, 30*time.Second, "replica up", func() bool { return len(processesWithEnv(mark)) == 1 })
	replica := output(t, c.start("mk-slow", `{}`, false))["replica"]

	running := c.start("mk-slow", sleepInputs(30*time.Second), true)["callID"].(string)
	c.waitState(running, "running")
	// Queued behind it, a call that would crash the model if it ever ran:
	// the model's replica and the crash counter prove it never did.
	queued := c.start("mk-slow", `{"crash":true}`, true)["callID"].(string)
	if r := c.check(queued, false); r["message"] != "queued" || r["queuePosition"] != float64(0) {
		t.Fatalf("queued call: %v; want queued at position 0", r)
	}
	if r := c.cancel(queued); r["message"] != "cancelled" || r["callID"] != queued || r["modelOutputs"] != nil {
		t.Fatalf("cancel of the queued call: %v", r)
	}
	if r := c.check(queued, false); r["message"] != "error: cancelled by request" || r["finished"] != true {
		t.Fatalf("check after cancel: %v", r)
	}

	began := time.Now()
	if r := c.cancel(running); r["message"] != "cancelled" {
		t.Fatalf("cancel of the running call: %v", r)
	}
	if took := time.Since(began); took > testenv.Scale(5*time.Second) {
		t.Errorf("cancelling a running call took %s; want about stopGrace (2s) at most [%s]", took, testenv.Load())
	}
	if r := c.check(running, true); r["message"] != "error: cancelled by request" {
		t.Fatalf("running call after cancel: %v", r)
	}
	next := c.start("mk-slow", `{"after":"cancel"}`, false)
	if next["message"] != "success" || output(t, next)["replica"] != replica {
		t.Fatalf("next call: %v; want success on the same replica (%v)", next, replica)
	}
	if got := d.metric(t, `inferd_replica_crashes_total{project="slow"}`); got != "0" {
		t.Errorf("replica crashes = %s: the cancelled call reached the model", got)
	}
	if got := d.metric(t, `inferd_calls_cancelled_total{project="slow"}`); got != "2" {
		t.Errorf("inferd_calls_cancelled_total = %s, want 2", got)
	}
	if r := c.cancel(next["callID"].(string)); r["message"] != "error: call already finished (succeeded)" {
		t.Errorf("cancel of a finished call: %v", r)
	}

	// The CLI cancels through the daemon too.
	viaCLI := c.start("mk-slow", sleepInputs(30*time.Second), true)["callID"].(string)
	if out, err := d.cli("call", "cancel", viaCLI); err != nil || !strings.Contains(out, "Cancelled call "+viaCLI) {
		t.Fatalf("inferd call cancel: %q, %v", out, err)
	}

	// A cancelled call stays cancelled across a kill -9.
	d.restartAfterKill(t, &c)
	for _, id := range []string{queued, running, viaCLI} {
		if r := c.check(id, false); r["message"] != "error: cancelled by request" {
			t.Errorf("call %s after kill -9: %v", id, r)
		}
	}
	// The CLI says it as the check does.
	if _, err := d.cli("call", "cancel", viaCLI); err == nil || !strings.Contains(err.Error(), "call already finished (failed: cancelled by request)") {
		t.Errorf("inferd call cancel of a cancelled call: %v", err)
	}
	if r := c.cancel(queued); r["message"] != "error: call already finished (failed: cancelled by request)" {
		t.Errorf("second cancel after restart: %v", r)
	}
}

func TestPurgeQueueEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	d, c, key := callControlDaemon(t, "", echoProject("busy", "acme", "mk-busy", echo, marker(), "")+"    maxReplicas: 1\n")
	running := c.start("mk-busy", sleepInputs(30*time.Second), true)["callID"].(string)
	c.waitState(running, "running")
	var queued []string
	for i := range 50 {
		queued = append(queued, c.start("mk-busy", fmt.Sprintf(`{"i":%d}`, i), true)["callID"].(string))
	}
	hdr := map[string]string{"X-Service-API-Key": key}
	status, body := do(t, "DELETE", d.base+"/v1/projects/busy/queue", hdr, "")
	if status != http.StatusOK || body["removed"] != float64(50) {
		t.Fatalf("purge: HTTP %d %v; want 200 removed 50", status, body)
	}
	for _, id := range []string{queued[0], queued[25], queued[49]} {
		if r := c.check(id, false); r["message"] != "error: cancelled: queue purged" {
			t.Errorf("purged call %s: %v", id, r)
		}
	}
	if r := c.check(running, false); r["message"] != "running" {
		t.Errorf("running call after the purge: %v; want it to run on", r)
	}
	status, body = do(t, "DELETE", d.base+"/v1/projects/busy/queue/", hdr, "")
	if status != http.StatusOK || body["removed"] != float64(0) {
		t.Errorf("second purge: HTTP %d %v; want removed 0", status, body)
	}
	d.restartAfterKill(t, &c)
	if r := c.check(queued[10], false); r["message"] != "error: cancelled: queue purged" {
		t.Errorf("purged call after kill -9: %v", r)
	}
}

func TestQueueTimeoutAndCallTimeoutEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	d, c, _ := callControlDaemon(t, "", echoProject("busy", "acme", "mk-busy", echo, marker(), "")+"    maxReplicas: 1\n")
	running := c.start("mk-busy", sleepInputs(5*time.Second), true)["callID"].(string)
	c.waitState(running, "running")
	expiring := c.startWith("mk-busy", `{"crash":true}`, `,"startOnly":true,"queueTimeout":1`)["callID"].(string)
	if r := c.waitResult(expiring); r["message"] != "error: expired after 1s in the queue" {
		t.Fatalf("call behind a busy replica: %v", r)
	}
	if r := c.waitResult(running); r["message"] != "success" {
		t.Fatalf("busy call: %v", r)
	}
	// timeout lowers the project's inferenceTimeout (300 s) for one call.
	if r := c.startWith("mk-busy", `{"sleep":10}`, `,"timeout":1`); !strings.HasPrefix(r["message"].(string), "error: inference timed out after 1s") {
		t.Errorf("call with timeout 1: %v", r)
	}
	if got := d.metric(t, `inferd_calls_expired_total{project="busy"}`); got != "1" {
		t.Errorf("inferd_calls_expired_total = %s, want 1", got)
	}
	d.restartAfterKill(t, &c)
	if r := c.check(expiring, false); r["message"] != "error: expired after 1s in the queue" {
		t.Errorf("expired call after kill -9: %v", r)
	}
}

func TestPriorityEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	d, c, _ := callControlDaemon(t, "", echoProject("busy", "acme", "mk-busy", echo, marker(), "")+"    maxReplicas: 1\n")
	running := c.start("mk-busy", sleepInputs(3*time.Second), true)["callID"].(string)
	c.waitState(running, "running")
	var low, high []string
	for i := range 3 {
		low = append(low, c.startWith("mk-busy", fmt.Sprintf(`{"low":%d}`, i), `,"startOnly":true,"priority":"low"`)["callID"].(string))
	}
	for i := range 3 {
		high = append(high, c.startWith("mk-busy", fmt.Sprintf(`{"high":%d}`, i), `,"startOnly":true,"priority":"high"`)["callID"].(string))
	}
	if r := c.check(low[0], false); r["queuePosition"] != float64(3) {
		t.Errorf("first low call: %v; want queuePosition 3 (behind the high ones)", r)
	}
	for _, id := range append(append([]string{}, low...), high...) {
		if r := c.waitResult(id); r["message"] != "success" {
			t.Fatalf("call %s: %v", id, r)
		}
	}
	d.stop()
	calls := readDataFile(t, filepath.Join(d.dir, "data", "inferd.db"))
	lastHigh := calls[high[2]].Dispatched
	for _, id := range low {
		if !calls[id].Dispatched.After(lastHigh) {
			t.Errorf("low call %s dispatched at %s, before the last high one (%s)", id, calls[id].Dispatched, lastHigh)
		}
	}
}

func TestLowPriorityTakesOnlyIdleCapacityEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	manifest := echoProject("web", "acme", "mk-web", echo, marker(), "") + "    maxReplicas: 2\n    idleTimeout: 1\n" +
		echoProject("batch", "acme", "mk-batch", echo, marker(), "") + "    maxReplicas: 2\n    idleTimeout: 1\n"
	d, c, key := callControlDaemon(t, "cpuSlots: 1\n", manifest)
	// An idle box: a low call on a project at zero runs.
	if r := c.startWith("mk-batch", `{"first":1}`, `,"priority":"low"`); r["message"] != "success" {
		t.Fatalf("low call on an idle box: %v", r)
	}
	eventually(t, 30*time.Second, "batch's replica idles out", func() bool { return len(d.replicaStates(key, "batch")) == 0 })

	// web holds the only slot, and a second web call waits for a slot of its
	// own; a low batch call must not take it, and runs only after web's.
	web1 := c.start("mk-web", sleepInputs(3*time.Second), true)["callID"].(string)
	c.waitState(web1, "running")
	web2 := c.start("mk-web", `{"n":2}`, true)["callID"].(string)
	batch := c.startWith("mk-batch", `{"n":3}`, `,"startOnly":true,"priority":"low"`)["callID"].(string)
	for _, id := range []string{web1, web2, batch} {
		if r := c.waitResult(id); r["message"] != "success" {
			t.Fatalf("call %s: %v", id, r)
		}
	}
	d.stop()
	calls := readDataFile(t, filepath.Join(d.dir, "data", "inferd.db"))
	if b, w := calls[batch].Dispatched, calls[web2].Dispatched; !b.After(w) {
		t.Errorf("the low call was dispatched at %s, before the waiting normal call (%s)", b, w)
	}
}

func TestIdempotencyKeyEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	d, c, _ := callControlDaemon(t, "", echoProject("echo", "acme", "mk-echo", echo, marker(), ""))
	const extra = `,"idempotencyKey":"order-42"`
	var wg sync.WaitGroup
	ids := make([]string, 2)
	for i := range ids {
		wg.Go(func() { ids[i] = c.startWith("mk-echo", `{"sleep":1,"order":42}`, extra)["callID"].(string) })
	}
	wg.Wait()
	third := c.startWith("mk-echo", `{"order":42, "sleep":1}`, extra)
	if ids[0] != ids[1] || third["callID"] != ids[0] || third["message"] != "success" {
		t.Fatalf("callIDs %v and %v (%v); want one call, succeeded", ids, third["callID"], third["message"])
	}
	if got := d.metric(t, `inferd_calls_total{project="echo",outcome="succeeded"}`); got != "1" {
		t.Errorf("calls run = %s, want 1", got)
	}
	if r := c.startWith("mk-echo", `{"order":43}`, extra); r["message"] != "error: idempotencyKey reused with different inputs" {
		t.Errorf("other inputs under the key: %v", r)
	}
	// The key stays deduplicated across a kill -9.
	d = d.restartAfterKill(t, &c)
	again := c.startWith("mk-echo", `{"order":42,"sleep":1}`, extra+`,"startOnly":true`)
	if again["callID"] != ids[0] || again["message"] != "success" {
		t.Errorf("after kill -9: %v; want call %s, succeeded", again, ids[0])
	}
	if got := d.metric(t, `inferd_calls_total{project="echo",outcome="succeeded"}`); got != "0" {
		t.Errorf("calls run after the restart = %s, want 0", got)
	}
}

func TestRetriesEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	d, c, key := callControlDaemon(t, "", echoProject("flaky", "acme", "mk-flaky", echo, marker(), "")+"    retries: 1\n")
	flag := filepath.Join(t.TempDir(), "crashed")
	first := c.startWith("mk-flaky", fmt.Sprintf(`{"crashOnce":%q}`, flag), "")
	if first["message"] != "success" {
		t.Fatalf("a call whose model crashed once: %v; want success on the second attempt", first)
	}
	id := first["callID"].(string)
	if got := d.metric(t, `inferd_calls_retried_total{project="flaky"}`); got != "1" {
		t.Errorf("inferd_calls_retried_total = %s, want 1", got)
	}
	_, status := do(t, "GET", d.base+"/v1/status/calls", map[string]string{"X-Service-API-Key": key}, "")
	if !strings.Contains(fmt.Sprint(status), "attempt:2") || !strings.Contains(fmt.Sprint(status), id) {
		t.Errorf("status of the call lacks attempt 2: %v", status)
	}
	// A call running at a kill -9 runs again after the restart, same callID.
	running := c.start("mk-flaky", fmt.Sprintf(`{"sleep":%.1f,"n":2}`, testenv.Scale(3*time.Second).Seconds()), true)["callID"].(string)
	c.waitState(running, "running")
	// Its running write is durable once a later call's first write is: the
	// store commits in order.
	c.start("mk-flaky", `{"n":3}`, true)
	d = d.restartAfterKill(t, &c)
	if r := c.waitResult(running); r["message"] != "success" || output(t, r)["echo"].(map[string]any)["n"] != float64(2) {
		t.Errorf("call interrupted by a kill -9: %v; want it run again to success", r)
	}
	d.stop()
	if got := readDataFile(t, filepath.Join(d.dir, "data", "inferd.db"))[running]; got.Attempt != 2 || got.State != store.CallSucceeded {
		t.Errorf("stored call = attempt %d, %s; want attempt 2, succeeded", got.Attempt, got.State)
	}
}

func TestWarmupEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	mark := marker()
	// Long enough idle that the replica warmup readied is still there when
	// the status is read next, short enough to watch it go.
	idle := int(testenv.Scale(5 * time.Second).Seconds())
	d, _, key := callControlDaemon(t, "", echoProject("cold", "acme", "mk-cold", echo, mark, "")+fmt.Sprintf("    idleTimeout: %d\n", idle))
	hdr := map[string]string{"X-Service-API-Key": key}
	status, body := do(t, "POST", d.base+"/v1/projects/cold/warmup", hdr, "")
	if status != http.StatusOK || body["ready"] != true {
		t.Fatalf("warmup: HTTP %d %v", status, body)
	}
	if got := d.replicaStates(key, "cold"); len(got) != 1 || got[0] != "ready" {
		t.Fatalf("replicas right after warmup = %v, want one ready", got)
	}
	eventually(t, 30*time.Second, "the warmed replica follows idleTimeout", func() bool { return len(processesWithEnv(mark)) == 0 })
	if status, _ := do(t, "POST", d.base+"/v1/projects/nope/warmup", hdr, ""); status != http.StatusNotFound {
		t.Errorf("warmup of an unknown project: HTTP %d, want 404", status)
	}
}
