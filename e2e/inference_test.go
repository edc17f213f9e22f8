package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/store"
)

// echoProject is a manifest entry for examples/echo with a unique marker env.
func echoProject(id, team, modelKey, dir, mark, extra string) string {
	return fmt.Sprintf(`  - id: %s
    team: %s
    modelKey: %s
    command: ["python3", "server.py"]
    dir: %s
    env: {E2E_MARKER: "%s"%s}
`, id, team, modelKey, dir, mark, extra)
}

type inferenceClient struct {
	t    *testing.T
	base string
	key  string
}

func (c inferenceClient) start(modelKey, inputs string, startOnly bool) map[string]any {
	c.t.Helper()
	obj, err := c.tryStart(modelKey, inputs, startOnly)
	if err != nil {
		c.t.Fatal(err)
	}
	return obj
}

// tryStart is start for a goroutine other than the test's, which must not call
// t.Fatal: it returns the failure instead.
func (c inferenceClient) tryStart(modelKey, inputs string, startOnly bool) (map[string]any, error) {
	body := fmt.Sprintf(`{"id":"00000000-0000-0000-0000-000000000000","created":1,"apiKey":%q,"modelKey":%q,"startOnly":%t,"modelInputs":%s}`,
		c.key, modelKey, startOnly, inputs)
	status, obj, err := tryDo("POST", c.base+"/start/v4", nil, body)
	if err != nil {
		return nil, err
	}
	if status != 200 {
		return nil, fmt.Errorf("start answered HTTP %d: %v", status, obj)
	}
	return obj, envelopeErr(obj)
}

func (c inferenceClient) check(callID string, longPoll bool) map[string]any {
	c.t.Helper()
	body := fmt.Sprintf(`{"apiKey":%q,"callID":%q,"longPoll":%t}`, c.key, callID, longPoll)
	status, obj := do(c.t, "POST", c.base+"/check/v4/", nil, body)
	if status != 200 {
		c.t.Fatalf("check answered HTTP %d: %v", status, obj)
	}
	checkEnvelope(c.t, obj)
	return obj
}

// waitResult long-polls until the call has ended.
func (c inferenceClient) waitResult(callID string) map[string]any {
	c.t.Helper()
	const bound = 2 * time.Minute
	deadline := time.Now().Add(testenv.Scale(bound))
	for {
		r := c.check(callID, true)
		if msg := r["message"].(string); msg == "success" || strings.Contains(msg, "error") {
			return r
		} else if time.Now().After(deadline) {
			c.t.Fatal(testenv.Waited(bound, fmt.Sprintf("call %s to finish (long polls; it still says %q)", callID, msg)))
		}
	}
}

// checkEnvelope asserts the fields every inference answer carries.
func checkEnvelope(t *testing.T, obj map[string]any) {
	t.Helper()
	if err := envelopeErr(obj); err != nil {
		t.Fatal(err)
	}
}

// envelopeErr says what is wrong with an inference answer's envelope, if anything.
func envelopeErr(obj map[string]any) error {
	if _, ok := obj["id"].(string); !ok {
		return fmt.Errorf("id missing or not a string: %v", obj)
	}
	if _, ok := obj["message"].(string); !ok {
		return fmt.Errorf("message missing or not a string: %v", obj)
	}
	if c, ok := obj["created"].(float64); !ok || c != float64(int64(c)) || c < 1.7e9 {
		return fmt.Errorf("created must be integer Unix seconds: %v", obj)
	}
	if _, ok := obj["apiVersion"].(string); !ok {
		return fmt.Errorf("apiVersion missing: %v", obj)
	}
	return nil
}

func output(t *testing.T, r map[string]any) map[string]any {
	t.Helper()
	out, err := outputOf(r)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// outputOf returns the model's reply in a finished call's answer, or says why
// there is none; unlike output it is safe off the test's goroutine.
func outputOf(r map[string]any) (map[string]any, error) {
	outs, ok := r["modelOutputs"].([]any)
	if !ok || len(outs) != 1 {
		return nil, fmt.Errorf("modelOutputs should be [reply], got %v", r)
	}
	out, ok := outs[0].(map[string]any)
	if !ok {
		return nil, fmt.Errorf("modelOutputs[0] should be a JSON object, got %v", r)
	}
	return out, nil
}

func TestInferenceEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	// startWait, the call that outlasts it and inferenceTimeout stretch
	// alike on a busy machine: a quick call still ends within the wait and
	// the timeout, the long one still outlasts the wait.
	startWait, inferenceTimeout := testenv.Scale(time.Second), scaledSeconds(2*time.Second)
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(time.Second)+"\nlongPollWait: 5s\nmaxQueuedPerProject: 2\n"+
		"replica:\n  stopGrace: 2s\n  restartBackoff: 100ms\n  maxBootFailures: 2\n")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	otherKey := d.createKey("globex", false)
	d.apply("projects:\n" +
		echoProject("echo", "acme", "mk-echo", echo, mark, `, GREETING: "hi"`) + "    minReplicas: 1\n    maxReplicas: 2\n    idleTimeout: 1\n" +
		fmt.Sprintf("    inferenceTimeout: %d\n", inferenceTimeout) +
		echoProject("single", "acme", "mk-single", echo, mark, "") + "    maxReplicas: 1\n" +
		// broken exits at boot, saying why, within its bootTimeout: long
		// enough for python3 to start on a busy machine.
		echoProject("broken", "acme", "mk-broken", echo, mark, `, BOOT_FAIL: "1"`) + fmt.Sprintf("    bootTimeout: %d\n", scaledSeconds(5*time.Second)))
	c := inferenceClient{t: t, base: d.base, key: key}

	t.Run("minReplicas replica runs right after start", func(t *testing.T) {
		eventually(t, 20*time.Second, "one echo replica", func() bool { return len(processesWithEnv(mark)) == 1 })
		// startWait is 1s here: on a loaded machine a boot can take longer,
		// so the sync start below waits for a ready replica first.
		eventually(t, 60*time.Second, "echo replica ready", func() bool {
			return slices.Equal(d.replicaStates(key, "echo"), []string{"ready"})
		})
	})
	t.Run("sync start returns the reply", func(t *testing.T) {
		r := c.start("mk-echo", `{"prompt":"hello"}`, false)
		if r["message"] != "success" || r["finished"] != true {
			t.Fatalf("want success, got %v", r)
		}
		out := output(t, r)
		if out["echo"].(map[string]any)["prompt"] != "hello" || out["greeting"] != "hi" {
			t.Fatalf("reply %v", out)
		}
		if id, _ := r["callID"].(string); !strings.HasPrefix(id, "call_") {
			t.Fatalf("callID %v", r["callID"])
		}
	})
	t.Run("startOnly then long-poll check", func(t *testing.T) {
		r := c.start("mk-echo", `{"n":1}`, true)
		if r["finished"] != false || r["modelOutputs"] != nil || strings.Contains(r["message"].(string), "error") {
			t.Fatalf("startOnly answer %v", r)
		}
		res := c.waitResult(r["callID"].(string))
		if res["message"] != "success" || output(t, res)["echo"].(map[string]any)["n"] != 1.0 {
			t.Fatalf("check %v", res)
		}
	})
	t.Run("a call longer than the wait returns a callID, then success", func(t *testing.T) {
		r := c.start("mk-echo", sleepInputs(1500*time.Millisecond), false)
		if r["finished"] != false {
			t.Fatalf("a %s call should outlast the %s wait: %v", testenv.Scale(1500*time.Millisecond), startWait, r)
		}
		if msg := r["message"].(string); msg != "running" && msg != "queued" && msg != "booting" {
			t.Fatalf("pending message %q", msg)
		}
		if res := c.waitResult(r["callID"].(string)); res["message"] != "success" {
			t.Fatalf("check %v", res)
		}
	})
	t.Run("inference timeout", func(t *testing.T) {
		r := c.waitResult(c.start("mk-echo", `{"hang":true}`, true)["callID"].(string))
		if r["message"] != fmt.Sprintf("error: inference timed out after %ds", inferenceTimeout) {
			t.Fatalf("got %v", r["message"])
		}
	})
	t.Run("model crash mid-call", func(t *testing.T) {
		r := c.waitResult(c.start("mk-echo", `{"crash":true}`, true)["callID"].(string))
		if msg := r["message"].(string); !strings.HasPrefix(msg, "error: model process exited") || !strings.Contains(msg, "during inference") {
			t.Fatalf("got %q", msg)
		}
	})
	t.Run("model HTTP error", func(t *testing.T) {
		r := c.waitResult(c.start("mk-echo", `{"fail":"bad input"}`, true)["callID"].(string))
		if msg := r["message"].(string); !strings.HasPrefix(msg, "error: model returned HTTP 500") || !strings.Contains(msg, "bad input") {
			t.Fatalf("got %q", msg)
		}
	})
	t.Run("model that fails to start", func(t *testing.T) {
		r := c.waitResult(c.start("mk-broken", `{}`, true)["callID"].(string))
		if msg := r["message"].(string); !strings.HasPrefix(msg, "error: model failed to start") || !strings.Contains(msg, "BOOT_FAIL") {
			t.Fatalf("got %q", msg)
		}
	})
	t.Run("queue full", func(t *testing.T) {
		var last map[string]any
		for i := 0; i < 4; i++ {
			last = c.start("mk-single", sleepInputs(3*time.Second), true)
		}
		if last["message"] != "error: queue full (2 calls waiting); retry later" {
			t.Fatalf("the 4th call with 1 replica and a queue of 2 should be refused, got %v", last["message"])
		}
	})
	t.Run("another team cannot start or check", func(t *testing.T) {
		other := inferenceClient{t: t, base: d.base, key: otherKey}
		if r := other.start("mk-echo", `{}`, true); r["message"] != "error: unknown modelKey" {
			t.Fatalf("start with another team's modelKey: %v", r["message"])
		}
		callID := c.start("mk-echo", `{}`, true)["callID"].(string)
		if r := other.check(callID, false); !strings.HasPrefix(r["message"].(string), "error: callID not found") {
			t.Fatalf("check of another team's call: %v", r["message"])
		}
	})
	t.Run("bad requests get clear errors", func(t *testing.T) {
		for body, want := range map[string]string{
			`{"apiKey":`: "error: malformed JSON",
			`{"apiKey":"nope","modelKey":"mk-echo","modelInputs":{}}`:                                 "error: invalid apiKey",
			fmt.Sprintf(`{"apiKey":%q,"modelKey":"nope","modelInputs":{}}`, key):                      "error: unknown modelKey",
			fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","modelInputs":[1]}`, key):                  "error: modelInputs must be a JSON object",
			fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo"}`, key):                                    "error: missing modelInputs",
			fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","startOnly":"yes","modelInputs":{}}`, key): "error: startOnly must be a boolean",
		} {
			status, r := do(t, "POST", d.base+"/start/v4", nil, body)
			if status != 200 || !strings.HasPrefix(r["message"].(string), want) {
				t.Fatalf("body %s: status %d message %v, want %q", body, status, r["message"], want)
			}
		}
	})
	t.Run("daemon stays healthy", func(t *testing.T) {
		if status, _ := do(t, "GET", d.base+"/healthz", nil, ""); status != 200 {
			t.Fatal("healthz")
		}
		// Started, then checked: the faults' replicas may still be booting
		// anew past the 1 s a sync start waits.
		if r := c.waitResult(c.start("mk-echo", `{"ok":1}`, true)["callID"].(string)); r["message"] != "success" {
			t.Fatalf("a normal call after the faults: %v", r)
		}
	})
	t.Run("model processes never see inferd's environment", func(t *testing.T) {
		for _, pid := range processesWithEnv(mark) {
			if env := readEnviron(pid); strings.Contains(env, "INFERD_SECRET_PROBE") {
				t.Fatalf("replica %d sees the daemon's INFERD_SECRET_PROBE", pid)
			}
		}
	})
	d.stop()
	eventually(t, 10*time.Second, "no model process after shutdown", func() bool { return len(processesWithEnv(mark)) == 0 })
}

func TestScalingEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "cpuSlots: 8\nstartWait: "+scaledSetting(50*time.Second)+"\n")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	// A long idleTimeout during the burst: on a loaded box a replica idle
	// between two late calls must not stop and come back under a new id.
	project := "projects:\n" + echoProject("burst", "acme", "mk-burst", echo, mark, "") + "    minReplicas: 0\n    maxReplicas: 2\n"
	d.apply(project + "    idleTimeout: 600\n")
	c := inferenceClient{t: t, base: d.base, key: key}

	// Six overlapping calls: the project scales up at once, to max and no
	// further. The calls are held until both replicas are busy, so that one
	// replica cannot answer them all while the other boots on a slow box.
	release := filepath.Join(t.TempDir(), "release")
	var mu sync.Mutex
	replicas := map[string]int{}
	var wg sync.WaitGroup
	for i := 0; i < 6; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r, err := c.tryStart("mk-burst", fmt.Sprintf(`{"until":%q}`, release), false)
			if err != nil || r["message"] != "success" {
				t.Errorf("burst call: %v %v", r, err)
				return
			}
			out, err := outputOf(r)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			replicas[fmt.Sprint(out["replica"])]++
			mu.Unlock()
		}()
	}
	eventually(t, time.Minute, "both of burst's replicas busy with the held calls", func() bool {
		return slices.Equal(d.replicaStates(key, "burst"), []string{"busy", "busy"})
	})
	if n := len(processesWithEnv(mark)); n != 2 {
		t.Errorf("%d model processes running for six calls, max is 2", n)
	}
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if len(replicas) != 2 {
		t.Fatalf("six overlapping calls on maxReplicas 2 should use exactly 2 replicas, used %v", replicas)
	}
	if n := len(processesWithEnv(mark)); n > 2 {
		t.Fatalf("%d model processes running, max is 2", n)
	}
	// Above minReplicas 0, idle replicas go away after idleTimeout: lowered
	// to 1 s, it applies to the replicas already idle.
	d.apply(project + "    idleTimeout: 1\n")
	eventually(t, 15*time.Second, "idle replicas stopped", func() bool { return len(processesWithEnv(mark)) == 0 })
}

// TestCallsSurviveDaemonKill kills the daemon with one call running and
// four queued: after the restart the running call ends exactly
// "interrupted by a server restart" and every queued one runs with its own
// input.
func TestCallsSurviveDaemonKill(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, noLimits+"cpuSlots: 4\n")
	dataFile := filepath.Join(dir, "data", "inferd.db")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("slow", "acme", "mk-slow", echo, mark, "") + "    minReplicas: 1\n    maxReplicas: 1\n")
	c := inferenceClient{t: t, base: d.base, key: key}
	eventually(t, 20*time.Second, "replica up", func() bool { return len(processesWithEnv(mark)) == 1 })

	// One call finished; one that holds the only replica for 30 s, so it is
	// surely still running at the kill (and a daemon that wrongly ran it
	// again after the restart fails this test in about that time); four
	// queued behind it.
	done := c.start("mk-slow", `{"i":0}`, false)
	if done["message"] != "success" {
		t.Fatalf("first call: %v", done)
	}
	ids := []string{done["callID"].(string)}
	ids = append(ids, c.start("mk-slow", `{"i":1,"sleep":30}`, true)["callID"].(string))
	eventually(t, time.Minute, "call 1 running", func() bool { return c.check(ids[1], false)["message"] == "running" })
	// Each of these starts answers once its call's write has committed, and
	// the store commits writes in the order they were queued: call 1's
	// running write is durable by then too.
	for i := 2; i <= 5; i++ {
		ids = append(ids, c.start("mk-slow", fmt.Sprintf(`{"i":%d}`, i), true)["callID"].(string))
	}
	d.kill()
	eventually(t, time.Minute, "model processes die with the daemon", func() bool { return len(processesWithEnv(mark)) == 0 })
	stored := readDataFile(t, dataFile)
	for i, id := range ids {
		want := store.CallQueued
		switch i {
		case 0:
			want = store.CallSucceeded
		case 1:
			want = store.CallRunning
		}
		if got := stored[id].State; got != want {
			t.Fatalf("call %d is %q in the data file at the kill, want %q", i, got, want)
		}
	}

	d = startDaemon(t, dir, cfg)
	c.base = d.base
	for i, id := range ids {
		r := c.waitResult(id)
		msg := r["message"].(string)
		switch {
		case i == 1:
			if msg != msgRestart {
				t.Errorf("call %d, running at the kill, answered %q after the restart, want %q", i, msg, msgRestart)
			}
		case msg != "success":
			t.Errorf("call %d (%s), queued or done at the kill, answered %q after the restart, want success", i, id, msg)
		default:
			if got := output(t, r)["echo"].(map[string]any)["i"]; got != float64(i) {
				t.Errorf("call %s returned the result of input %v, want %d", id, got, i)
			}
		}
	}
	d.stop()
	eventually(t, 10*time.Second, "no model process after shutdown", func() bool { return len(processesWithEnv(mark)) == 0 })
}
