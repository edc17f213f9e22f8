package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// statusWaiting returns what /v1/status says project waits for ("" if
// nothing), as key sees it.
func (d *daemon) statusWaiting(key, project string) string {
	d.t.Helper()
	_, body := doRaw(d.t, "GET", d.base+"/v1/status/projects", map[string]string{"X-Service-API-Key": key}, "")
	var all struct {
		Results []struct {
			ID      string `json:"id"`
			Waiting string `json:"waiting"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &all); err != nil {
		d.t.Fatalf("status: %v in %s", err, body)
	}
	for _, p := range all.Results {
		if p.ID == project {
			return p.Waiting
		}
	}
	return ""
}

// createKeyWith makes a key with extra `key create` flags and returns its
// secret.
func (d *daemon) createKeyWith(team string, flags ...string) string {
	d.t.Helper()
	out, err := d.cli(append([]string{"key", "create", "--team", team}, flags...)...)
	if err != nil {
		d.t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// TestTeamQuotasEndToEnd shares a box of two CPU slots and two simulated
// GPUs between acme, whose quota the manifest sets, and labs: acme cannot
// take the box with its minimums, its flood is bounded by its queue quota
// and leaves labs a CPU slot, and at its GPU quota it waits while labs uses
// the GPU left free.
func TestTeamQuotasEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "cpuSlots: 2\nstartWait: "+scaledSetting(30*time.Second)+"\nlongPollWait: "+scaledSetting(10*time.Second)+"\nreplica:\n  stopGrace: 2s\n"+
		"gpu:\n  simulate:\n    - {name: Sim A, memoryMiB: 16384}\n    - {name: Sim B, memoryMiB: 16384}\n")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	acme, labs := d.createKey("acme", false), d.createKey("labs", false)
	admin := d.createKey("ops", true)
	out := d.apply("teams:\n  - {id: acme, quota: {replicas: 4, cpuSlots: 1, gpus: 1, queuedCalls: 3, queuedBytes: 1MiB}}\n" +
		"projects:\n" +
		echoProject("a", "acme", "mk-a", echo, mark, "") + "    maxReplicas: 2\n    caps: {maxReplicas: 2}\n" +
		echoProject("ag", "acme", "mk-ag", echo, mark, "") + "    gpus: 1\n    maxReplicas: 2\n" +
		echoProject("b", "labs", "mk-b", echo, mark, "") + "    maxReplicas: 2\n" +
		echoProject("bg", "labs", "mk-bg", echo, mark, "") + "    gpus: 1\n    maxReplicas: 1\n")
	if !strings.Contains(out, "team acme: quota replicas=4 gpus=1 cpuSlots=1 queuedCalls=3 queuedBytes=1048576") {
		t.Fatalf("apply output:\n%s", out)
	}
	hdr := func(k string) map[string]string { return map[string]string{"X-Service-API-Key": k} }

	t.Run("a minimum of 1000 is refused naming the quota", func(t *testing.T) {
		status, body := do(t, "PUT", d.base+"/v1/projects/a", hdr(acme), `{"minReplicas": 1000, "maxReplicas": 1000}`)
		msg, _ := body["error"].(map[string]any)["message"].(string)
		if status != http.StatusBadRequest || !strings.Contains(msg, "team acme's replicas quota of 4") {
			t.Fatalf("PUT = %d %v; want 400 naming acme's replicas quota", status, body)
		}
		status, body = do(t, "PUT", d.base+"/v1/projects/a", hdr(acme), `{"maxReplicas": 3}`)
		msg, _ = body["error"].(map[string]any)["message"].(string)
		if status != http.StatusBadRequest || !strings.Contains(msg, "caps.maxReplicas of 2") {
			t.Fatalf("PUT over the cap = %d %v; want 400 naming the cap", status, body)
		}
		if _, p := do(t, "GET", d.base+"/v1/projects/a", hdr(acme), ""); p["minReplicas"] != 0.0 || p["maxReplicas"] != 2.0 {
			t.Errorf("a refused PUT changed the project: %v", p)
		}
		if out, err := d.cli("apply", "-f", writeFile(t, d.dir, "greedy.yaml", "projects:\n"+
			echoProject("a", "acme", "mk-a", echo, mark, "")+"    minReplicas: 5\n    maxReplicas: 5\n")); err == nil ||
			!strings.Contains(err.Error(), "replicas quota of 4") {
			t.Errorf("apply of minimums over the quota: %v\n%s", err, out)
		}
	})

	t.Run("under a flood from acme, labs's calls still run", func(t *testing.T) {
		ca, cb := inferenceClient{t: t, base: d.base, key: acme}, inferenceClient{t: t, base: d.base, key: labs}
		var ids []string
		refused := 0
		for range 8 {
			r := ca.start("mk-a", sleepInputs(6*time.Second), true)
			switch msg := r["message"].(string); {
			case msg == "error: team acme is at its queuedCalls quota (3); retry later":
				refused++
			case strings.Contains(msg, "error"):
				t.Fatalf("acme's start: %v", r)
			default:
				ids = append(ids, r["callID"].(string))
			}
		}
		if refused == 0 {
			t.Error("acme's flood was never refused by its queuedCalls quota")
		}
		r := cb.start("mk-b", `{"hello": "labs"}`, false)
		if r["message"] != "success" {
			t.Fatalf("labs's call under acme's flood: %v", r)
		}
		// labs did not wait for acme's flood to drain: acme's calls run one
		// at a time on its one CPU slot, so at most one has finished by now.
		// (Without its cpuSlots quota acme would hold both slots, and labs
		// would wait until acme's queue was empty, its last call running.)
		pending := 0
		for _, id := range ids {
			if ca.check(id, false)["message"] != "success" {
				pending++
			}
		}
		if pending < 2 {
			t.Errorf("labs's call ran only once acme's queue had drained (%d of acme's %d calls unfinished)", pending, len(ids))
		}
		if w := d.statusWaiting(acme, "a"); w != "" && !strings.Contains(w, "team acme is at its cpuSlots quota (1)") {
			t.Errorf("a waits for %q", w)
		}
		for _, id := range ids {
			if res := ca.waitResult(id); res["message"] != "success" {
				t.Errorf("acme's call %s: %v", id, res)
			}
		}
	})

	t.Run("acme at its GPU quota waits while labs uses the free GPU", func(t *testing.T) {
		ca, cb := inferenceClient{t: t, base: d.base, key: acme}, inferenceClient{t: t, base: d.base, key: labs}
		first := ca.start("mk-ag", sleepInputs(3*time.Second), true)
		second := ca.start("mk-ag", sleepInputs(3*time.Second), true)
		eventually(t, 30*time.Second, "ag waits at acme's gpus quota", func() bool {
			return d.statusWaiting(admin, "ag") == "waiting: team acme is at its gpus quota (1)"
		})
		if n := len(d.replicaStates(acme, "ag")); n != 1 {
			t.Errorf("ag has %d replicas, want 1 (its quota)", n)
		}
		r := cb.start("mk-bg", `{"env": "CUDA_VISIBLE_DEVICES"}`, false)
		if r["message"] != "success" {
			t.Fatalf("labs's GPU call: %v", r)
		}
		for _, c := range []map[string]any{first, second} {
			if res := ca.waitResult(c["callID"].(string)); res["message"] != "success" {
				t.Errorf("acme's GPU call: %v", res)
			}
		}
		_, body := doRaw(t, "GET", d.base+"/v1/status", hdr(acme), "")
		var st struct {
			Teams []struct {
				ID    string         `json:"id"`
				Quota map[string]int `json:"quota"`
			} `json:"teams"`
		}
		if err := json.Unmarshal(body, &st); err != nil || len(st.Teams) != 1 || st.Teams[0].ID != "acme" || st.Teams[0].Quota["gpus"] != 1 {
			t.Errorf("acme's status teams = %+v (%v)", st.Teams, err)
		}
		if out, err := d.cli("team", "list"); err != nil || !strings.Contains(out, "acme") || !strings.Contains(out, "/4") {
			t.Errorf("team list: %v\n%s", err, out)
		}
	})
}

// TestScopedKeysEndToEnd: a read key lists projects but may not start a
// call or change a project; an expired key is refused everywhere.
func TestScopedKeysEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	d.apply("projects:\n" + echoProject("p", "acme", "mk-p", echo, marker(), ""))
	read := d.createKeyWith("acme", "--scope", "read")
	// Long enough to be used once on a loaded box (stretched on a busy
	// one), short enough to wait out.
	short := d.createKeyWith("acme", "--expires", scaledSetting(8*time.Second))
	hdr := func(k string) map[string]string { return map[string]string{"X-Service-API-Key": k} }

	if out, err := d.cli("key", "list", "--team", "acme"); err != nil || !strings.Contains(out, " read ") || !strings.Contains(out, "infer,read,manage") {
		t.Errorf("key list: %v\n%s", err, out)
	}
	if status, body := do(t, "GET", d.base+"/v1/projects", hdr(read), ""); status != 200 || len(body["results"].([]any)) != 1 {
		t.Errorf("read key lists: %d %v", status, body)
	}
	status, body := do(t, "PUT", d.base+"/v1/projects/p", hdr(read), `{"maxReplicas": 2}`)
	if msg, _ := body["error"].(map[string]any)["message"].(string); status != http.StatusForbidden || !strings.Contains(msg, "this key may not change projects") {
		t.Errorf("read key PUT: %d %v", status, body)
	}
	r := inferenceClient{t: t, base: d.base, key: read}.start("mk-p", `{}`, true)
	if msg, _ := r["message"].(string); !strings.HasPrefix(msg, "error: this key may not start or check calls") {
		t.Errorf("read key start: %v", r)
	}

	// The short key works until it expires, then is refused.
	if status, _ := do(t, "GET", d.base+"/v1/projects", hdr(short), ""); status != 200 {
		t.Errorf("fresh key refused: %d", status)
	}
	eventually(t, 30*time.Second, "the key to expire", func() bool {
		status, _ := doRaw(t, "GET", d.base+"/v1/projects", hdr(short), "")
		return status == http.StatusUnauthorized
	})
	if _, body := do(t, "GET", d.base+"/v1/projects", hdr(short), ""); !strings.Contains(body["error"].(map[string]any)["message"].(string), "expired") {
		t.Errorf("expired key answer: %v", body)
	}
	r = inferenceClient{t: t, base: d.base, key: short}.start("mk-p", `{}`, true)
	if r["message"] != "error: this API key has expired" {
		t.Errorf("expired key start: %v", r)
	}
}

// TestFairShareEvictionEndToEnd: on three CPU slots, acme holds two idle
// replicas and ops one, the least recently used; labs's call evicts one of
// acme's (above its share), not ops's (at its share).
func TestFairShareEvictionEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "cpuSlots: 3\nstartWait: "+scaledSetting(30*time.Second)+"\nlongPollWait: "+scaledSetting(10*time.Second)+"\nreplica:\n  stopGrace: 2s\n")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	acme, ops, labs := d.createKey("acme", false), d.createKey("ops", false), d.createKey("labs", false)
	d.apply("projects:\n" +
		echoProject("a", "acme", "mk-a", echo, mark, "") + "    maxReplicas: 2\n    idleTimeout: 600\n" +
		echoProject("o", "ops", "mk-o", echo, mark, "") + "    maxReplicas: 1\n    idleTimeout: 600\n" +
		echoProject("b", "labs", "mk-b", echo, mark, "") + "    maxReplicas: 1\n")
	if r := (inferenceClient{t: t, base: d.base, key: ops}).start("mk-o", `{}`, false); r["message"] != "success" {
		t.Fatalf("ops: %v", r)
	}
	ca := inferenceClient{t: t, base: d.base, key: acme}
	// Two calls held until acme's two replicas both run one: on a busy
	// machine one replica could otherwise answer both while the other
	// boots, and the scheduler need not keep a boot no call waits for.
	release := filepath.Join(t.TempDir(), "release")
	hold := fmt.Sprintf(`{"until":%q}`, release)
	x, y := ca.start("mk-a", hold, true), ca.start("mk-a", hold, true)
	eventually(t, time.Minute, "acme's two replicas busy with its two calls", func() bool {
		return slices.Equal(d.replicaStates(acme, "a"), []string{"busy", "busy"})
	})
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []map[string]any{x, y} {
		if res := ca.waitResult(c["callID"].(string)); res["message"] != "success" {
			t.Fatalf("acme: %v", res)
		}
	}
	if n := len(d.replicaStates(acme, "a")); n != 2 {
		t.Fatalf("acme has %d replicas, want 2", n)
	}
	if r := (inferenceClient{t: t, base: d.base, key: labs}).start("mk-b", `{}`, false); r["message"] != "success" {
		t.Fatalf("labs: %v", r)
	}
	line := d.logs.waitFor(t, "evicting idle replica", 30*time.Second)
	if !strings.Contains(line, `"project":"a"`) || !strings.Contains(line, `"for":"b"`) {
		t.Errorf("eviction: %s; want one of acme's replicas, for b", line)
	}
	if states := d.replicaStates(ops, "o"); len(states) != 1 || states[0] == "stopping" {
		t.Errorf("ops's replica: %v; want it kept", states)
	}
}

// writeFile writes content to name in dir and returns its path.
func writeFile(t *testing.T, dir, name, content string) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
