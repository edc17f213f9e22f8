package e2e

// Dynamic batching end to end: the real binary, the batch example model
// (examples/batch, one pass at a time) over real HTTP. A call with
// {"hold": FILE} holds its pass until the file exists, so the test queues
// the next calls while a batch runs, then lets it go.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// batchProject is a manifest entry for the batch example with batching on.
func batchProject(t *testing.T, id, modelKey string, concurrency, maxSize, maxWaitMs int) string {
	t.Helper()
	dir, err := filepath.Abs("examples/batch")
	if err != nil {
		t.Fatal(err)
	}
	echoDir(t) // python3 is needed
	return fmt.Sprintf(`  - id: %s
    team: acme
    modelKey: %s
    command: ["python3", "server.py"]
    dir: %s
    batchPath: /batch
    batch: {maxSize: %d, maxWaitMs: %d}
    concurrency: %d
    minReplicas: 1
    maxReplicas: 1
`, id, modelKey, dir, maxSize, maxWaitMs, concurrency)
}

// hold is a file a call's pass waits for; release creates it.
type hold string

func newHold(t *testing.T) hold { return hold(filepath.Join(t.TempDir(), "go")) }

func (h hold) inputs() string { return fmt.Sprintf(`{"hold":%q}`, string(h)) }

func (h hold) release(t *testing.T) {
	t.Helper()
	if err := os.WriteFile(string(h), nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// startAll starts calls (startOnly) with the given inputs, in order, and
// returns their IDs.
func (c inferenceClient) startAll(modelKey string, inputs ...string) []string {
	c.t.Helper()
	var ids []string
	for _, in := range inputs {
		ids = append(ids, c.start(modelKey, in, true)["callID"].(string))
	}
	return ids
}

// heldBatch starts a call whose pass is held and waits until it runs: the
// calls started next queue behind it.
func (c inferenceClient) heldBatch(modelKey string, h hold) string {
	c.t.Helper()
	id := c.start(modelKey, h.inputs(), true)["callID"].(string)
	c.waitState(id, "running")
	return id
}

func TestBatchingEndToEnd(t *testing.T) {
	t.Parallel()
	d, c, key := callControlDaemon(t, "", batchProject(t, "batch", "mk-batch", 1, 4, 200))
	eventually(t, time.Minute, "replica ready", func() bool {
		return slices.Equal(d.replicaStates(key, "batch"), []string{"ready"})
	})

	t.Run("calls arriving together are answered in batches of at most maxSize", func(t *testing.T) {
		h := newHold(t)
		first := c.heldBatch("mk-batch", h)
		var inputs []string
		for n := range 10 {
			inputs = append(inputs, fmt.Sprintf(`{"n":%d}`, n))
		}
		ids := c.startAll("mk-batch", inputs...)
		h.release(t)
		if r := c.waitResult(first); r["message"] != "success" {
			t.Fatalf("held call: %v", r)
		}
		sizes := map[float64]float64{} // pass → calls in it
		lastPass := 0.0
		for n, id := range ids {
			r := c.waitResult(id)
			if r["message"] != "success" {
				t.Fatalf("call %d: %v", n, r)
			}
			out := output(t, r)
			pass, size := out["pass"].(float64), out["batchSize"].(float64)
			if r["batchSize"] != size {
				t.Errorf("call %d: the answer says batchSize %v, the model saw a batch of %v", n, r["batchSize"], size)
			}
			if out["echo"].(map[string]any)["n"] != float64(n) {
				t.Errorf("call %d got another call's output: %v", n, out)
			}
			if pass < lastPass {
				t.Errorf("call %d ran in pass %v after a later call's pass %v", n, pass, lastPass)
			}
			lastPass = pass
			sizes[pass]++
		}
		var got []float64
		for _, n := range sizes {
			got = append(got, n)
		}
		slices.Sort(got)
		if !slices.Equal(got, []float64{2, 4, 4}) {
			t.Errorf("the 10 queued calls ran in passes of %v calls, want 4, 4 and 2", got)
		}
	})

	t.Run("per-item errors fail only their call", func(t *testing.T) {
		h := newHold(t)
		c.heldBatch("mk-batch", h)
		ids := c.startAll("mk-batch", `{"n":1}`, `{"fail":"image 2 is too small"}`, `{"n":3}`)
		h.release(t)
		want := []string{"success", "error: model returned an error for this call: image 2 is too small", "success"}
		for i, id := range ids {
			if r := c.waitResult(id); r["message"] != want[i] || r["batchSize"] != 3.0 {
				t.Errorf("call %d: %v; want %q in a batch of 3", i, r, want[i])
			}
		}
	})

	t.Run("cancel: a queued call leaves the batch, a running one ends alone", func(t *testing.T) {
		h := newHold(t)
		c.heldBatch("mk-batch", h)
		ids := c.startAll("mk-batch", `{"n":1}`, `{"n":2}`, `{"n":3}`)
		if r := c.cancel(ids[1]); r["message"] != "cancelled" {
			t.Fatalf("cancel of a queued call: %v", r)
		}
		h.release(t)
		for _, id := range []string{ids[0], ids[2]} {
			if r := c.waitResult(id); r["message"] != "success" || r["batchSize"] != 2.0 {
				t.Errorf("call %s: %v; want success in a batch of 2 (the cancelled call left it)", id, r)
			}
		}
		if r := c.check(ids[1], false); r["message"] != "error: cancelled by request" {
			t.Errorf("cancelled call: %v", r)
		}

		// A batch of two held by its first call: cancel the second.
		h = newHold(t)
		c.heldBatch("mk-batch", h)
		inner := newHold(t)
		pair := c.startAll("mk-batch", inner.inputs(), `{"n":5}`)
		h.release(t)
		c.waitState(pair[1], "running")
		if r := c.cancel(pair[1]); r["message"] != "cancelled" {
			t.Fatalf("cancel of a call in a running batch: %v", r)
		}
		if r := c.check(pair[1], false); r["message"] != "error: cancelled by request" {
			t.Errorf("cancelled call of a running batch: %v", r)
		}
		inner.release(t)
		if r := c.waitResult(pair[0]); r["message"] != "success" || r["batchSize"] != 2.0 {
			t.Errorf("the other call of the batch: %v; want success, its batch of 2 went on", r)
		}
	})

	t.Run("each call of a batch keeps its own webhook and events", func(t *testing.T) {
		rcv := newHookReceiver(t, nil)
		h := newHold(t)
		c.heldBatch("mk-batch", h)
		hooked := c.startWith("mk-batch", `{"n":1}`, fmt.Sprintf(`,"startOnly":true,"webhook":%q`, rcv.url))["callID"].(string)
		followed := c.start("mk-batch", `{"n":2}`, true)["callID"].(string)
		events := followCall(t, d.base, followed, key)
		h.release(t)
		m := rcv.next(t, time.Minute)
		if !strings.Contains(string(m.body), `"event":"completed"`) || !strings.Contains(string(m.body), hooked) ||
			!strings.Contains(string(m.body), `"batchSize":2`) {
			t.Errorf("webhook body %s; want the completed event of call %s, in a batch of 2", m.body, hooked)
		}
		if ev := events.next(); ev.name != "state" || !strings.Contains(ev.data, "succeeded") {
			t.Errorf("event %v, want the followed call's final state", ev)
		}
		// The outputs are as the model wrote them (spaces and all), on one line.
		var done struct {
			CallID       string
			ModelOutputs []struct{ Echo struct{ N int } }
		}
		if ev := events.next(); ev.name != "done" || json.Unmarshal([]byte(ev.data), &done) != nil || done.CallID != followed ||
			len(done.ModelOutputs) != 1 || done.ModelOutputs[0].Echo.N != 2 {
			t.Errorf("event %v, want done with call %s's own output", ev, followed)
		}
	})

	t.Run("priority orders the calls within and across batches", func(t *testing.T) {
		h := newHold(t)
		c.heldBatch("mk-batch", h)
		var ids []string
		for _, p := range []string{"low", "normal", "low", "high", "normal"} {
			r := c.startWith("mk-batch", fmt.Sprintf(`{"p":%q}`, p), fmt.Sprintf(`,"startOnly":true,"priority":%q`, p))
			ids = append(ids, r["callID"].(string))
		}
		h.release(t)
		type ran struct {
			at       float64 // pass, then place in its batch
			priority string
		}
		var got []ran
		for _, id := range ids {
			out := output(t, c.waitResult(id))
			got = append(got, ran{out["pass"].(float64)*1000 + out["index"].(float64), out["echo"].(map[string]any)["p"].(string)})
		}
		slices.SortFunc(got, func(a, b ran) int { return int(a.at - b.at) })
		var order []string
		for _, r := range got {
			order = append(order, r.priority)
		}
		if want := []string{"high", "normal", "normal", "low", "low"}; !slices.Equal(order, want) {
			t.Errorf("calls ran in the order %v, want %v", order, want)
		}
	})

	t.Run("a failed request fails every call of its batch, saying so", func(t *testing.T) {
		for _, tc := range []struct{ bad, want string }{
			{`{"reject":"out of memory"}`, `error: model returned HTTP 500: {"error": "out of memory"} (the whole batch of 3 calls failed)`},
			{`{"dropOne":true}`, "error: model returned an invalid reply: 2 outputs for 3 inputs (the whole batch of 3 calls failed)"},
			{`{"crash":true}`, "error: model process exited (exit status 3) during inference (the whole batch of 3 calls failed)"},
		} {
			h := newHold(t)
			c.heldBatch("mk-batch", h)
			ids := c.startAll("mk-batch", `{"n":1}`, tc.bad, `{"n":3}`)
			h.release(t)
			for i, id := range ids {
				if r := c.waitResult(id); r["message"] != tc.want {
					t.Errorf("%s, call %d: %v; want %q", tc.bad, i, r["message"], tc.want)
				}
			}
		}
		// The crashed replica is replaced, and the next call runs.
		if r := c.start("mk-batch", `{"n":9}`, false); r["message"] != "success" {
			t.Errorf("call after the crash: %v", r)
		}
	})

	if got := d.metric(t, `inferd_batch_size_count{project="batch"}`); got == "0" {
		t.Error("no batch in inferd_batch_size")
	}
	_, st := do(t, "GET", d.base+"/v1/status/projects", map[string]string{"X-Service-API-Key": key}, "")
	if ps, _ := st["results"].([]any); len(ps) != 1 || ps[0].(map[string]any)["meanBatchSize"].(float64) <= 1 {
		t.Errorf("status: %v; want the batch project's mean batch size above 1", st)
	}
}

// A lone call waits for company only while another batch of its project
// runs, and then no longer than maxWaitMs: it is answered while the other
// batch is still held.
func TestALoneBatchCallWaitsAtMostMaxWaitEndToEnd(t *testing.T) {
	t.Parallel()
	d, c, key := callControlDaemon(t, "", batchProject(t, "wait", "mk-wait", 2, 8, 300))
	eventually(t, time.Minute, "replica ready", func() bool {
		return slices.Equal(d.replicaStates(key, "wait"), []string{"ready"})
	})
	// Nothing runs: a lone call leaves at once.
	if r := c.start("mk-wait", `{"n":0}`, false); r["message"] != "success" || r["batchWaitMs"] != 0.0 {
		t.Fatalf("a call with nothing else running: %v; want success without a wait", r)
	}
	h := newHold(t)
	held := c.heldBatch("mk-wait", h)
	r := c.start("mk-wait", `{"n":1}`, false) // sync: admitted and dispatchable at once
	if r["message"] != "success" || r["batchSize"] != 1.0 {
		t.Fatalf("lone call: %v", r)
	}
	if w := r["batchWaitMs"].(float64); w < 290 {
		t.Errorf("batchWaitMs = %v: the lone call did not wait for company (maxWaitMs 300)", w)
	}
	if got := c.check(held, false)["message"]; got != "running" {
		t.Errorf("the held batch is %v; the lone call should have been answered while it ran", got)
	}
	h.release(t)
	if r := c.waitResult(held); r["message"] != "success" {
		t.Errorf("held call: %v", r)
	}
}

// In cluster mode each node batches the calls queued on it: a node on its
// own embedded etcd runs a batching project as the single box does, the
// batch fields of its calls kept in etcd.
func TestBatchingOnAClusterNodeEndToEnd(t *testing.T) {
	t.Parallel()
	section, _ := clusterEmbedConfig(t, "node-1")
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\nlongPollWait: "+scaledSetting(10*time.Second)+"\n"+section)
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + batchProject(t, "batch", "mk-batch", 1, 4, 200))
	c := inferenceClient{t: t, base: d.base, key: key}
	h := newHold(t)
	c.heldBatch("mk-batch", h)
	ids := c.startAll("mk-batch", `{"n":1}`, `{"n":2}`, `{"n":3}`)
	h.release(t)
	for i, id := range ids {
		r := c.waitResult(id)
		if r["message"] != "success" || r["batchSize"] != 3.0 || output(t, r)["batchSize"] != 3.0 {
			t.Errorf("call %d: %v; want success in a batch of 3", i, r)
		}
	}
}
