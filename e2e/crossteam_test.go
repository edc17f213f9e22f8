package e2e

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

// TestRulesSpanningTeamsEndToEnd runs two teams of two projects each on the
// real daemon. acme (a1, a2) has a runningCalls quota of 1; labs (b1, b2)
// none. While acme's call on a1 is held running under idempotency key
// order-42:
//   - labs's start under the same key is a call of its own, which runs: a
//     key is its team's, never "reused" for another team's call;
//   - acme's call on a2 waits, its project at acme's runningCalls quota,
//     though a2 has a ready replica: the quota counts the whole team;
//   - labs's calls on b1 and b2 run at once.
//
// Once a1's call is let go, a2's runs.
func TestRulesSpanningTeamsEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	mark := marker()
	dir, cfg := newDaemonDir(t, "cpuSlots: 4\nstartWait: "+scaledSetting(20*time.Second)+"\nlongPollWait: "+scaledSetting(10*time.Second)+"\n")
	d := startDaemon(t, dir, cfg)
	acme := inferenceClient{t: t, base: d.base, key: d.createKey("acme", false)}
	labs := inferenceClient{t: t, base: d.base, key: d.createKey("labs", false)}
	admin := d.createKey("ops", true)
	d.apply("teams:\n  - {id: acme, quota: {runningCalls: 1}}\nprojects:\n" +
		echoProject("a1", "acme", "mk-a1", echo, mark, "") + "    minReplicas: 1\n" +
		echoProject("a2", "acme", "mk-a2", echo, mark, "") + "    minReplicas: 1\n" +
		echoProject("b1", "labs", "mk-b1", echo, mark, "") +
		echoProject("b2", "labs", "mk-b2", echo, mark, ""))
	release := filepath.Join(t.TempDir(), "release")
	const key = `,"idempotencyKey":"order-42","startOnly":true`

	held := acme.startWith("mk-a1", `{"holdOnce":"`+release+`"}`, key)["callID"].(string)
	acme.waitState(held, "running")

	ofLabs := labs.startWith("mk-b1", `{"team":"labs"}`, key)
	if ofLabs["message"] != "queued" && ofLabs["message"] != "running" && ofLabs["message"] != "success" || ofLabs["callID"] == held {
		t.Fatalf("labs's start under acme's live key: %v; want a call of its own (acme's is %s)", ofLabs, held)
	}
	if r := labs.waitResult(ofLabs["callID"].(string)); r["message"] != "success" || output(t, r)["echo"].(map[string]any)["team"] != "labs" {
		t.Fatalf("labs's call: %v", r)
	}

	waiting := acme.start("mk-a2", `{"n": 2}`, true)["callID"].(string)
	eventually(t, 30*time.Second, "a2 to wait at acme's runningCalls quota", func() bool {
		return d.statusWaiting(admin, "a2") == "waiting: team acme is at its runningCalls quota (1)"
	})
	for _, mk := range []string{"mk-b1", "mk-b2"} {
		if r := labs.start(mk, `{}`, false); r["message"] != "success" {
			t.Fatalf("labs's call on %s while acme is at its quota: %v", mk, r)
		}
	}
	if r := acme.check(waiting, false); r["message"] != "queued" {
		t.Fatalf("a2's call while a1's runs: %v; want queued", r)
	}

	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{held, waiting} {
		if r := acme.waitResult(id); r["message"] != "success" {
			t.Errorf("acme's call %s: %v", id, r)
		}
	}
	if again := labs.startWith("mk-b1", `{"team":"labs"}`, key); again["callID"] != ofLabs["callID"] {
		t.Errorf("labs's repeat once acme's call is stored: %v; want its own call %s", again, ofLabs["callID"])
	}
}
