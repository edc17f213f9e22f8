package e2e

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// TestModelFaultsEndToEnd covers the model faults that TestInferenceEndToEnd
// does not (it has the crash mid-call, the hang past inferenceTimeout and the
// HTTP error): a non-JSON reply, a 10 MiB reply, a model that exits right
// after it is ready, one that crash-loops at boot, and one that leaks a child
// process. Each call ends in its own message and the daemon stays healthy.
func TestModelFaultsEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, noLimits+"startWait: "+scaledSetting(20*time.Second)+"\nlongPollWait: 5s\ncpuSlots: 8\n"+
		"replica:\n  stopGrace: 2s\n  restartBackoff: 1s\n  maxRestartBackoff: 4s\n  maxBootFailures: 3\n")
	mark, leakMark := marker(), marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" +
		echoProject("faulty", "acme", "mk-faulty", echo, mark, "") + "    minReplicas: 1\n    maxReplicas: 1\n" +
		echoProject("leaky", "acme", "mk-leaky", echo, leakMark, "") + "    maxReplicas: 1\n    idleTimeout: 600\n" +
		// flaky exits half a second after it is ready (longer on a busy
		// machine, so that its call is surely dispatched by then), in the
		// middle of a call that runs longer still.
		echoProject("flaky", "acme", "mk-flaky", echo, mark, fmt.Sprintf(`, EXIT_AFTER_READY: "%.1f"`, testenv.Scale(500*time.Millisecond).Seconds())) +
		"    maxReplicas: 1\n" +
		echoProject("crashloop", "acme", "mk-crashloop", echo, mark, `, BOOT_FAIL: "1"`) + "    minReplicas: 1\n    maxReplicas: 1\n")
	c := faultClient{base: d.base, key: key}
	call := func(t *testing.T, modelKey, inputs string) map[string]any {
		t.Helper()
		r, err := c.start(modelKey, inputs, true)
		if err != nil {
			t.Fatalf("start: %v", err)
		}
		if isFinal(r) { // refused at once, as by a project whose boots failed
			return r
		}
		if r, err = c.final(r["callID"].(string)); err != nil {
			t.Fatal(err)
		}
		return r
	}

	t.Run("non-JSON reply", func(t *testing.T) {
		msg := message(call(t, "mk-faulty", `{"raw":"plain text"}`))
		if !strings.HasPrefix(msg, "error: model returned an invalid reply") || !strings.Contains(msg, "plain text") {
			t.Fatalf("got %q", msg)
		}
	})
	t.Run("10 MiB reply is delivered whole", func(t *testing.T) {
		r := call(t, "mk-faulty", `{"bytes":10485760}`)
		if message(r) != "success" {
			t.Fatalf("got %q", message(r))
		}
		outs := r["modelOutputs"].([]any)
		if got := len(outs[0].(map[string]any)["data"].(string)); got != 10<<20 {
			t.Fatalf("reply data is %d bytes, want %d", got, 10<<20)
		}
	})
	t.Run("exits right after ready", func(t *testing.T) {
		msg := message(call(t, "mk-flaky", sleepInputs(3*time.Second)))
		if msg != "error: model process exited (exit status 4) during inference" {
			t.Fatalf("got %q", msg)
		}
	})
	t.Run("crash loop at boot backs off", func(t *testing.T) {
		msg := message(call(t, "mk-crashloop", `{}`))
		// minReplicas boots before the call comes: it waits for the boots
		// that fail it, or it comes after them and fails at once.
		if !strings.HasPrefix(msg, "error: model failed to start: process exited with status 1: boot failed: BOOT_FAIL is set") {
			t.Fatalf("got %q", msg)
		}
		// Restart backoff 1 s, doubling up to 4 s: the 3rd failed boot waits 4 s for
		// the 4th. Log times have whole seconds, so a gap of 4 s reads as
		// at least 3; a backoff that did not grow would give 1 or 2.
		var times []time.Time
		eventually(t, time.Minute, "four failed boots of crashloop", func() bool {
			times = bootFailures(t, d.logs, "crashloop")
			return len(times) >= 4
		})
		if gap := times[3].Sub(times[2]); gap < 3*time.Second {
			t.Fatalf("3rd to 4th failed boot took %v; the backoff does not grow (boots at %v)", gap, times)
		}
	})
	t.Run("leaked child dies with its replica", func(t *testing.T) {
		r, err := c.start("mk-leaky", `{"spawn":true}`, false)
		if err != nil || message(r) != "success" {
			t.Fatalf("spawn call: %v %v", r, err)
		}
		// The child's pid is of the replica's PID namespace: count instead.
		if pids := processesWithEnv(leakMark); len(pids) != 2 {
			t.Fatalf("want the replica and its child running, got pids %v", pids)
		}
		// Lowering idleTimeout to 1 s stops the replica, idle since the call;
		// its child (which inherited the marker) must go with it. (A 1 s
		// idleTimeout from the start could stop it before the look at /proc
		// above on a loaded box.)
		d.apply("projects:\n" + echoProject("leaky", "acme", "mk-leaky", echo, leakMark, "") + "    maxReplicas: 1\n    idleTimeout: 1\n")
		eventually(t, 20*time.Second, "the leaky replica and its child stopped", func() bool {
			return len(processesWithEnv(leakMark)) == 0
		})
	})
	t.Run("daemon stays healthy", func(t *testing.T) {
		if status, _ := doRaw(t, "GET", d.base+"/healthz", nil, ""); status != 200 {
			t.Fatal("healthz")
		}
		if r := call(t, "mk-faulty", `{"i":7}`); message(r) != "success" {
			t.Fatalf("a normal call after the faults: %v", r)
		}
	})
	d.stop()
	eventually(t, 20*time.Second, "no model process after shutdown", func() bool {
		return len(processesWithEnv(mark))+len(processesWithEnv(leakMark)) == 0
	})
}

// bootFailures returns the times the daemon logged a failed boot of project.
func bootFailures(t *testing.T, logs *lineLog, project string) []time.Time {
	t.Helper()
	var times []time.Time
	for _, line := range strings.Split(logs.String(), "\n") {
		var e struct {
			Message string
			Project string
			Time    time.Time
		}
		if json.Unmarshal([]byte(line), &e) != nil || e.Message != "replica failed to boot" || e.Project != project {
			continue
		}
		times = append(times, e.Time)
	}
	return times
}
