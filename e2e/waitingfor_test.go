package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// TestChecksSayWhyACallWaits starts calls that queue behind a booting
// replica, a busy replica with another booting, a team's runningCalls
// quota and maxReplicas, and checks that each check answers the state as
// its message, its place in the queue, and waitingFor naming that cause;
// once the project has run a call, an estimate (etaMs) too.
func TestChecksSayWhyACallWaits(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "cpuSlots: 8\n")
	d := startDaemon(t, dir, cfg)
	mark := marker()
	// The boots and the calls that hold a replica last 3 s, longer on a
	// busy machine, so that each is still on when the checks look.
	bootDelay := fmt.Sprintf(`, BOOT_DELAY: "%.1f"`, testenv.Scale(3*time.Second).Seconds())
	d.apply("teams:\n  - {id: capped, quota: {runningCalls: 1}}\nprojects:\n" +
		echoProject("slowboot", "waits", "mk-slowboot", echo, mark, bootDelay) + "    maxReplicas: 1\n" +
		echoProject("pair", "waits", "mk-pair", echo, mark, bootDelay) + "    minReplicas: 1\n    maxReplicas: 2\n" +
		echoProject("single", "waits", "mk-single", echo, mark, "") + "    minReplicas: 1\n    maxReplicas: 1\n" +
		echoProject("metered", "capped", "mk-metered", echo, mark, "") + "    minReplicas: 2\n    maxReplicas: 2\n")
	waits := inferenceClient{t: t, base: d.base, key: d.createKey("waits", false)}
	capped := inferenceClient{t: t, base: d.base, key: d.createKey("capped", false)}
	eventually(t, time.Minute, "the minimum replicas ready", func() bool {
		_, body := doRaw(t, "GET", d.base+"/v1/status/projects", map[string]string{"X-Service-API-Key": waits.key}, "")
		return strings.Count(string(body), `"state":"ready"`) == 2 // pair's and single's
	})

	// expect checks call id: message state, a place in the queue, and
	// waitingFor with code and a text holding each of texts.
	expect := func(c inferenceClient, id, state, code string, texts ...string) map[string]any {
		t.Helper()
		r := c.check(id, false)
		w, _ := r["waitingFor"].(map[string]any)
		if r["message"] != state || r["queuePosition"] == nil || w == nil || w["code"] != code {
			t.Fatalf("check of a call waiting for %s = %v; want message %s, a queuePosition and waitingFor %s", code, r, state, code)
		}
		for _, text := range texts {
			if !strings.Contains(fmt.Sprint(w["text"]), text) {
				t.Errorf("waitingFor text %q lacks %q", w["text"], text)
			}
		}
		return r
	}

	// A replica booting for the call.
	boot := waits.start("mk-slowboot", `{}`, true)["callID"].(string)
	expect(waits, boot, "booting", "booting", "replica booting (")

	// single's one replica busy, and maxReplicas 1: the next call waits.
	waits.start("mk-single", `{"sleep": 0.2}`, false) // a run to estimate from
	long := waits.start("mk-single", sleepInputs(3*time.Second), true)["callID"].(string)
	waits.waitState(long, "running")
	behind := waits.start("mk-single", `{}`, true)["callID"].(string)
	r := expect(waits, behind, "queued", "maxReplicas", "maxReplicas 1 reached", "its replica busy")
	if eta, ok := r["etaMs"].(float64); !ok || eta <= 0 || eta > float64(testenv.Scale(10*time.Second).Milliseconds()) {
		t.Errorf("etaMs behind a busy replica = %v; want an estimate of a few seconds [%s]", r["etaMs"], testenv.Load())
	}

	// pair's one replica busy, a second booting: the call waits for either.
	busy := waits.start("mk-pair", sleepInputs(3*time.Second), true)["callID"].(string)
	waits.waitState(busy, "running")
	next := waits.start("mk-pair", `{}`, true)["callID"].(string)
	expect(waits, next, "queued", "replicasBusy", "its replica busy", "another booting")

	// Team capped runs one call at a time, though its two replicas could
	// run two.
	first := capped.start("mk-metered", sleepInputs(3*time.Second), true)["callID"].(string)
	capped.waitState(first, "running")
	held := capped.start("mk-metered", `{}`, true)["callID"].(string)
	expect(capped, held, "queued", "teamQuota", "team capped quota runningCalls 1/1")

	for _, id := range []string{boot, long, behind, busy, next} {
		if got := waits.waitResult(id); got["message"] != "success" {
			t.Errorf("call %s = %v", id, got)
		}
	}
	for _, id := range []string{first, held} {
		if got := capped.waitResult(id); got["message"] != "success" {
			t.Errorf("call %s = %v", id, got)
		}
	}
}
