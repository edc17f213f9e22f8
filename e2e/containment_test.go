package e2e

// The replica sandbox through a live daemon, as an attacker would try it:
// docs/security.md's threat-model table, tested both ways (each row's "no"
// in the default sandbox, and what the opt-outs give back).

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// hostileDir copies e2e/testdata/hostile.py where any user can read it.
func hostileDir(t *testing.T) string {
	t.Helper()
	return readableModel(t, "e2e/testdata/hostile.py")
}

// hostileProject is a manifest entry running the hostile model.
func hostileProject(id, team, modelKey, dir, mark, extra string) string {
	return fmt.Sprintf(`  - id: %s
    team: %s
    modelKey: %s
    command: ["/usr/bin/python3", "server.py"]
    dir: %s
    env: {E2E_MARKER: "%s", SECRET_OF: "%s-%s"}
%s`, id, team, modelKey, dir, mark, team, mark, extra)
}

// ask runs one call and returns the model's reply; the call must succeed.
func ask(t *testing.T, c inferenceClient, modelKey string, inputs any) map[string]any {
	t.Helper()
	in, err := json.Marshal(inputs)
	if err != nil {
		t.Fatal(err)
	}
	r := c.start(modelKey, string(in), false)
	if r["message"] != "success" {
		t.Fatalf("call %s: %v", in, r)
	}
	return output(t, r)
}

// TestTeamsAreContained runs two teams' projects on one daemon; team A's
// model, running a call for team A, tries against team B's running replica
// everything docs/security.md lists: read its environment (its secrets),
// signal it, list the box's processes (command lines, inferd's --config),
// reach its server and inferd's API over the network, and leave a child
// that outlives its own replica. In the default sandbox every attempt fails
// and nothing A started survives the daemon; with the opt-outs
// (replica.user: root, network: host) the same test shows what each one
// gives back: the network, not B's processes (A's PID namespace has none
// of them, whoever A runs as).
func TestTeamsAreContained(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t, "the sandbox switches users and makes cgroups and network namespaces only as root")
	for _, mode := range []struct {
		name      string
		config    string
		contained bool // each attempt must fail
	}{
		{"default sandbox", "", true},
		{"replica.user root and network host", "replica:\n  user: root\n  network: host\n", false},
	} {
		t.Run(mode.name, func(t *testing.T) {
			dir, cfg := newDaemonDir(t, mode.config)
			d := startDaemonEnv(t, dir, cfg)
			markA, markB := marker(), marker()
			models := hostileDir(t)
			keyA, keyB := d.createKey("team-a", false), d.createKey("team-b", false)
			applied := d.apply("projects:\n" +
				hostileProject("proj-a", "team-a", "mk-a", models, markA, "") +
				hostileProject("proj-b", "team-b", "mk-b", models, markB, ""))
			if strings.Contains(applied, "warning") {
				t.Errorf("apply warns of a readable model: %s", applied)
			}
			a := inferenceClient{t: t, base: d.base, key: keyA}
			b := inferenceClient{t: t, base: d.base, key: keyB}
			victim := ask(t, b, "mk-b", map[string]any{})
			attacker := ask(t, a, "mk-a", map[string]any{})
			bPort := int(victim["port"].(float64))
			bPids := processesWithEnv(markB)
			if len(bPids) != 1 {
				t.Fatalf("B's model processes: %v, want one", bPids)
			}
			bPid := bPids[0] // as the host numbers it: B's own pid is of its namespace
			t.Logf("A runs as uid %v, B as uid %v; B is pid %d on port %d", attacker["uid"], victim["uid"], bPid, bPort)
			if mode.contained && (attacker["uid"] == victim["uid"] || attacker["uid"] == 0.0) {
				t.Errorf("A and B run as uids %v and %v: want a distinct unprivileged uid each", attacker["uid"], victim["uid"])
			}

			// Every attempt comes from a call of team A's own, with A's key.
			got := ask(t, a, "mk-a", map[string]any{
				"readEnviron": bPid,
				"fetch":       fmt.Sprintf("http://127.0.0.1:%d/id", bPort),
				"escape":      true,
				"listProc":    true,
			})
			api := ask(t, a, "mk-a", map[string]any{"fetch": d.base + "/healthz"})

			secret := "SECRET_OF=team-b-" + markB
			readB := strings.Contains(got["environ"].(string), secret)
			reachedB := strings.Contains(got["fetch"].(string), `"proj-b-`)
			reachedAPI := !strings.HasPrefix(api["fetch"].(string), "error:")
			t.Logf("reading B's environ: %.60q; fetching B's port: %.60q; fetching inferd's API: %.60q", got["environ"], got["fetch"], api["fetch"])
			// B's process is not in A's PID namespace, in every mode; nor is
			// inferd, whose command line names its config.
			if readB || got["environ"] != "error: No such file or directory" {
				t.Errorf("A read B's environment: %q", got["environ"])
			}
			for _, cmdline := range got["procs"].([]any) {
				c := cmdline.(string)
				_, args, _ := strings.Cut(c, ": ")
				if args == "" {
					continue // a process between fork and exec, or a zombie: nothing shown
				}
				if strings.Contains(c, d.cfgPath) || !strings.Contains(c, "server.py") && !strings.Contains(c, "sleep") && !strings.HasPrefix(c, "1: inferd-replica-init") {
					t.Errorf("A sees a process that is not its own: %q", c)
				}
			}
			if mode.contained {
				if reachedB {
					t.Errorf("A reached B's model over the network: %q", got["fetch"])
				}
				if reachedAPI {
					t.Errorf("A reached inferd's API from inside its sandbox: %q", api["fetch"])
				}
			} else {
				// What the docs' table says the opt-outs give back.
				if !reachedB || !reachedAPI {
					t.Errorf("on the host network A should reach B's port and inferd's API (the docs say so): %q, %q", got["fetch"], api["fetch"])
				}
			}

			// A signal last: in every mode A finds no such process.
			if sig := ask(t, a, "mk-a", map[string]any{"signal": bPid})["signal"]; sig != "error: No such process" {
				t.Errorf("A's SIGKILL to B: %q, want no such process", sig)
			}
			if again := ask(t, b, "mk-b", map[string]any{}); again["replica"] != victim["replica"] || processGone(bPid) {
				t.Errorf("B's replica changed from %v to %v after A's signal", victim["replica"], again["replica"])
			}

			// The child A left in a session of its own dies with A's replica,
			// in every mode: the cgroup and the PID namespace hold it, whoever
			// it runs as.
			before := processesWithEnv(markA)
			if len(before) < 2 {
				t.Fatalf("A's processes before the daemon stopped: %v, want its model and the escaped child: the test shows nothing", before)
			}
			d.stop()
			if left := processesWithEnv(markA); len(left) != 0 {
				t.Errorf("after inferd stopped, A's processes %v are alive (of %v)", left, before)
			}
			if left := processesWithEnv(markB); len(left) != 0 {
				t.Errorf("after inferd stopped, B's processes %v are alive", left)
			}
		})
	}
}

// processGone reports whether pid no longer runs (a zombie counts as gone).
func processGone(pid int) bool {
	stat, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "stat"))
	return err != nil || isZombie(stat)
}

// TestApplyRefusesAModelItsUIDCannotRead: a project's replicas run under a
// uid of their own, which must be able to read the model's dir and run its
// program; apply says so, names the uid, and applies nothing.
func TestApplyRefusesAModelItsUIDCannotRead(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t, "models run under a uid of their own only when inferd is root")
	dir, cfg := newDaemonDir(t, "")
	d := startDaemonEnv(t, dir, cfg)
	private := filepath.Join(t.TempDir(), "model") // t.TempDir is 0700: no other user gets in
	if err := os.Mkdir(private, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(d.dir, "hidden.yaml")
	if err := os.WriteFile(path, []byte(hostileProjectManifest("hidden", private)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := d.cli("apply", "-f", path)
	want := "project hidden: dir " + private + " is not readable by a uid of the project's own (replica.user: per-project), who runs the model"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("apply of a model its uid cannot read: %v, output %q; want it refused with %q", err, out, want)
	}
	if list, _ := d.cli("project", "list"); strings.Contains(list, "hidden") {
		t.Errorf("the refused project was applied: %s", list)
	}
}

func hostileProjectManifest(id, dir string) string {
	return "projects:\n" + hostileProject(id, "t", "mk-"+id, dir, marker(), "")
}

// TestOutOfMemoryEndsTheCallAndTheNextCallBootsAFreshReplica: a project with
// memoryMiB: 200 whose model allocates 1 GiB.
func TestOutOfMemoryEndsTheCallAndTheNextCallBootsAFreshReplica(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t, "memory limits need a cgroup, which inferd makes only as root")
	dir, cfg := newDaemonDir(t, "replica:\n  restartBackoff: 100ms\n")
	d := startDaemonEnv(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + hostileProject("big", "acme", "mk-big", hostileDir(t), marker(), "    memoryMiB: 200\n"))
	c := inferenceClient{t: t, base: d.base, key: key}
	first := ask(t, c, "mk-big", map[string]any{"allocate": 50})

	r := c.start("mk-big", `{"allocate": 1024}`, false)
	if want := "error: model ran out of memory (limit 200 MiB)"; r["message"] != want {
		t.Fatalf("allocating 1 GiB under 200 MiB: %v, want %q", r["message"], want)
	}
	if status, _ := doRaw(t, "GET", d.base+"/healthz", nil, ""); status != http.StatusOK {
		t.Fatalf("the daemon after its model's OOM kill: /healthz %d", status)
	}
	next := ask(t, c, "mk-big", map[string]any{"allocate": 50})
	if next["replica"] == first["replica"] {
		t.Errorf("the next call ran on replica %v, the killed one", next["replica"])
	}

	status, body := doRaw(t, "GET", d.base+"/v1/status/projects", map[string]string{"X-Service-API-Key": key}, "")
	var st struct {
		Results []struct {
			ID       string `json:"id"`
			OOMKills int    `json:"oomKills"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &st); status != 200 || err != nil || len(st.Results) != 1 || st.Results[0].OOMKills != 1 {
		t.Errorf("status: %d %s, want oomKills 1", status, body)
	}
	if m := scrapeMetrics(t, d.base); m[`inferd_replica_oom_kills_total{project="big"}`] != 1 {
		t.Errorf("inferd_replica_oom_kills_total = %v, want 1", m[`inferd_replica_oom_kills_total{project="big"}`])
	}
}

// TestCrashLoopFloodingItsLogStaysWithinTheLogBudget: every boot of a
// crash-looping model is a new replica id with log files of its own; the
// project's logs together stay under replica.logMaxBytesPerProject, the
// oldest removed first.
func TestCrashLoopFloodingItsLogStaysWithinTheLogBudget(t *testing.T) {
	t.Parallel()
	const budget = 256 << 10
	dir, cfg := newDaemonDir(t, fmt.Sprintf(`replica:
  logMaxBytes: 65536
  logKeep: 2
  logMaxBytesPerProject: %d
  restartBackoff: 10ms
  maxRestartBackoff: 20ms
  maxBootFailures: 1000
`, budget))
	d := startDaemon(t, dir, cfg)
	// 200 KB of log per boot, then exit 1; minReplicas keeps it booting.
	d.apply(strings.Replace("projects:\n"+hostileProject("flood", "acme", "mk-flood", hostileDir(t), marker(), "    minReplicas: 1\n"),
		`env: {`, `env: {BOOT_LOG_BYTES: "200000", `, 1))
	eventually(t, 2*time.Minute, "ten boots of the crash-looping model", func() bool {
		return strings.Count(d.logs.String(), `"booting replica"`) >= 10
	})
	d.stop()

	projectLogs := filepath.Join(dir, "data", "logs", "acme", "flood")
	entries, err := os.ReadDir(projectLogs)
	if err != nil {
		t.Fatal(err)
	}
	var total int64
	var names []string
	for _, e := range entries {
		if info, err := e.Info(); err == nil && info.Mode().IsRegular() {
			total += info.Size()
			names = append(names, e.Name())
		}
	}
	if total > budget {
		t.Fatalf("the project's logs hold %d bytes after the crash loop, over its %d budget: %v", total, budget, names)
	}
	if total < budget/2 {
		t.Errorf("the project's logs hold only %d bytes of a %d budget: newer output was removed too", total, budget)
	}
	// The newest boot that wrote anything kept all of its output; the
	// oldest boots' logs are gone.
	perReplica := map[int]int64{}
	for _, e := range entries {
		id, _, _ := strings.Cut(strings.TrimPrefix(e.Name(), "flood-"), ".")
		n, _ := strconv.Atoi(id)
		if info, err := e.Info(); err == nil {
			perReplica[n] += info.Size()
		}
	}
	newest := 0
	for n, size := range perReplica {
		if size > 0 && n > newest {
			newest = n
		}
	}
	if perReplica[newest] < 200000 {
		t.Errorf("the newest boot with output (flood-%d) kept %d of its 200000 bytes: %v", newest, perReplica[newest], names)
	}
	if _, ok := perReplica[1]; ok {
		t.Errorf("the first boot's log is still there: %v", names)
	}
}

// TestRedirectAndHugeHeaderAreModelErrors: inferd follows no redirect (the
// inputs of a large call are never re-sent elsewhere) and reads no reply
// header past 1 MiB.
func TestRedirectAndHugeHeaderAreModelErrors(t *testing.T) {
	t.Parallel()
	var fetched atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetched.Add(1)
		w.Write([]byte(`{"stolen": true}`))
	}))
	defer target.Close()
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + hostileProject("sly", "acme", "mk-sly", hostileDir(t), marker(), ""))
	c := inferenceClient{t: t, base: d.base, key: key}
	large := strings.Repeat("i", 64<<10) // past the connection pool's 32 KiB: net/http's path
	for _, tc := range []struct {
		name, inputs, want string
	}{
		{"307, small inputs", fmt.Sprintf(`{"redirect": %q}`, target.URL), "error: model returned HTTP 307"},
		{"307, large inputs", fmt.Sprintf(`{"redirect": %q, "pad": %q}`, target.URL, large), "error: model returned HTTP 307"},
		{"300 MiB header", `{"hugeHeader": 300}`, "error: model returned an invalid reply: reply headers larger than 1048576 bytes"},
		{"300 MiB header, large inputs", fmt.Sprintf(`{"hugeHeader": 300, "pad": %q}`, large), "error: model returned an invalid reply: reply headers larger than 1048576 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := c.start("mk-sly", tc.inputs, false)
			if msg, _ := r["message"].(string); !strings.HasPrefix(msg, tc.want) {
				t.Fatalf("message %q, want it to start %q", msg, tc.want)
			}
		})
	}
	if n := fetched.Load(); n != 0 {
		t.Fatalf("the redirect target was fetched %d times", n)
	}
	// The model still serves: the bad replies cost it nothing.
	ask(t, c, "mk-sly", map[string]any{})
}
