package e2e

// The replica sandbox's second wave (issue 27), through a live daemon, each
// test re-running one reproduction: a data dir made 0755 beforehand, files
// left in /dev/shm, a squatted Potassium helper folder, a daemon killed
// with kill -9, and a model making a user namespace. Other teams' /proc is
// in TestTeamsAreContained.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// openToAll makes dirs (a test's temp dir and its parent are 0700)
// traversable by any user, as an admin's 0755 would.
func openToAll(t *testing.T, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
}

// oneHostileProject starts a daemon (models as root) with project id of
// team acme running the hostile model, marked with the returned marker;
// extra is more of its manifest entry.
func oneHostileProject(t *testing.T, id, extra string) (*daemon, inferenceClient, string) {
	t.Helper()
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	mark := marker()
	d.apply("projects:\n" + hostileProject(id, "acme", "mk-"+id, hostileDir(t), mark, extra))
	return d, inferenceClient{t: t, base: d.base, key: key}, mark
}

// TestAnOpenDataDirLeaksNoLog: an admin made the data dir 0755, and an
// older inferd left a team's log 0644 in it. The daemon closes both when it
// starts and says the protection is on; another team's model, under a uid
// of its own, reads neither that log nor a fresh one.
func TestAnOpenDataDirLeaksNoLog(t *testing.T) {
	testenv.NeedRoot(t, "models run under a uid of their own only when inferd is root")
	t.Parallel()
	dir, cfg := newDaemonDir(t, "")
	data := filepath.Join(dir, "data")
	oldLog := filepath.Join(data, "logs", "team-b", "proj-b", "proj-b-0.log")
	openToAll(t, filepath.Dir(dir), dir, data, filepath.Dir(oldLog))
	if err := os.WriteFile(oldLog, []byte("B's old secret\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	d := startDaemonEnv(t, dir, cfg)
	if line := d.logs.waitFor(t, `replica sandbox`, 10*time.Second); !strings.Contains(line, `"privateFiles":"on: `) {
		t.Errorf("the start-up line does not say privateFiles is on: %s", line)
	}
	keyA, keyB := d.createKey("team-a", false), d.createKey("team-b", false)
	models := hostileDir(t)
	d.apply("projects:\n" + hostileProject("proj-a", "team-a", "mk-a", models, marker(), "") +
		hostileProject("proj-b", "team-b", "mk-b", models, marker(), ""))
	victim := ask(t, inferenceClient{t: t, base: d.base, key: keyB}, "mk-b", map[string]any{})
	freshLog := filepath.Join(data, "logs", "team-b", "proj-b", fmt.Sprint(victim["replica"])+".log")
	if b, err := os.ReadFile(freshLog); err != nil || !strings.Contains(string(b), "hostile model listening") {
		t.Fatalf("B's log %s: %q, %v", freshLog, b, err)
	}
	a := inferenceClient{t: t, base: d.base, key: keyA}
	for _, log := range []string{oldLog, freshLog} {
		if got := ask(t, a, "mk-a", map[string]any{"readFile": log})["file"]; got != "error: Permission denied" {
			t.Errorf("team A's model reading %s: %q, want Permission denied", log, got)
		}
	}
	for _, path := range []string{data, oldLog} {
		if fi, err := os.Stat(path); err != nil || fi.Mode().Perm()&0o077 != 0 {
			t.Errorf("%s after the start: %v, %v; want it closed to others", path, fi.Mode(), err)
		}
	}
}

// TestReplicaShmIsItsOwnWithinMemoryAndGoesWithIt: a project limited to
// 200 MiB writes 100 MiB to /dev/shm, which the host never sees; writing
// 300 MiB more ends in its limit; nothing it wrote is left once it stops.
func TestReplicaShmIsItsOwnWithinMemoryAndGoesWithIt(t *testing.T) {
	testenv.NeedRoot(t, "a private /dev/shm and a memory limit need root")
	t.Parallel()
	d, c, mark := oneHostileProject(t, "shm", "    memoryMiB: 200\n")
	name := "inferd-e2e-" + mark
	if got := ask(t, c, "mk-shm", map[string]any{"shm": map[string]any{"name": name, "mib": 100}})["shm"]; got != "ok" {
		t.Fatalf("100 MiB to /dev/shm under memoryMiB 200: %q", got)
	}
	if _, err := os.Stat("/dev/shm/" + name); !os.IsNotExist(err) {
		t.Errorf("the replica's /dev/shm file shows in the host's: %v", err)
	}
	r := c.start("mk-shm", fmt.Sprintf(`{"shm": {"name": %q, "mib": 300}}`, name+"-big"), false)
	out, _ := r["modelOutputs"].([]any)
	// The memory cgroup, charged for the tmpfs's pages, ends it first; its
	// size (memoryMiB) would refuse the write otherwise.
	if r["message"] != "error: model ran out of memory (limit 200 MiB)" && !strings.Contains(fmt.Sprint(out), "No space left on device") {
		t.Errorf("300 MiB more to /dev/shm: %v, want the memory limit", r)
	}
	d.stop()
	if left, _ := filepath.Glob("/dev/shm/" + name + "*"); len(left) != 0 {
		t.Errorf("left in /dev/shm after the replica: %v", left)
	}
}

// TestPotassiumSquatDoesNotBlockAnotherProject: team A's model makes the
// Potassium helper folders an older inferd used, fixed names in the shared
// temp dir; team B's Potassium project on the host's network (which needs
// the helper) still boots and answers, its helper in a folder of its own.
func TestPotassiumSquatDoesNotBlockAnotherProject(t *testing.T) {
	testenv.NeedRoot(t, "models run under a uid of their own only when inferd is root")
	const python = "/usr/bin/python3"
	if out, err := exec.Command(python, "-c", "import flask, werkzeug").CombinedOutput(); err != nil {
		testenv.Missing(t, "%s cannot import flask and werkzeug (%v: %s); install python3-flask (scripts/test-deps.sh does)",
			python, err, strings.TrimSpace(string(out)))
	}
	t.Parallel()
	// The daemon's temp dir, shared with models as /tmp is without a mount
	// namespace: this test's own, so that a squat touches no other test.
	shared := filepath.Join(t.TempDir(), "tmp")
	openToAll(t, filepath.Dir(filepath.Dir(shared)), filepath.Dir(shared), shared)
	if err := os.Chmod(shared, testenv.SharedTempMode); err != nil {
		t.Fatal(err)
	}
	app := t.TempDir()
	openToAll(t, filepath.Dir(app), app)
	for _, f := range []string{"app.py", "potassium.py", "fake_potassium.py"} {
		code, err := os.ReadFile(filepath.Join("examples", "potassium", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(app, f), code, 0o644); err != nil {
			t.Fatal(err)
		}
	}

	dir, cfg := newDaemonDir(t, "")
	d := startDaemonEnv(t, dir, cfg, "TMPDIR="+shared)
	keyA, keyB := d.createKey("team-a", false), d.createKey("team-b", false)
	d.apply("projects:\n" + hostileProject("squatter", "team-a", "mk-a", hostileDir(t), marker(), ""))
	a := inferenceClient{t: t, base: d.base, key: keyA}
	for _, name := range []string{".inferd-potassium-shim-0", ".inferd-potassium-shim"} {
		if got := ask(t, a, "mk-a", map[string]any{"mkdir": filepath.Join(shared, name)})["mkdir"]; got != "ok" {
			t.Fatalf("team A's model squatting %s: %q", name, got)
		}
	}

	d.apply(fmt.Sprintf(`projects:
  - id: potassium-host
    team: team-b
    modelKey: mk-b
    command: [%q, "app.py"]
    dir: %s
    protocol: potassium
    network: host
`, python, app))
	b := inferenceClient{t: t, base: d.base, key: keyB}
	if r := b.start("mk-b", `{"prompt": "hi"}`, false); r["message"] != "success" {
		t.Fatalf("team B's Potassium app beside the squat: %v", r)
	}
}

// TestNoReplicaChildOutlivesADaemonKilledWithKill9: a replica's child in a
// session of its own (setsid) is gone within a second of the daemon's
// SIGKILL, with no daemon left to clean up: the replica's init dies by its
// parent-death signal and the kernel ends its PID namespace.
func TestNoReplicaChildOutlivesADaemonKilledWithKill9(t *testing.T) {
	testenv.NeedRoot(t, "PID namespaces need root")
	t.Parallel()
	d, c, mark := oneHostileProject(t, "orphan", "")
	ask(t, c, "mk-orphan", map[string]any{"escape": true})
	if before := processesWithEnv(mark); len(before) < 2 {
		t.Fatalf("the model and its escaped child: %v, want both", before)
	}
	d.kill()
	// A bounded poll: a process that is not ours has no exit to wait on.
	eventually(t, time.Second, "no process of the replica a second after the daemon's SIGKILL", func() bool {
		return len(processesWithEnv(mark)) == 0
	})
}

// TestModelMakesNoUserNamespaceUnlessItsProjectAllows: unshare
// (CLONE_NEWUSER) fails in a model by default, and works in one of a
// project that says allowUserNamespaces: true.
func TestModelMakesNoUserNamespaceUnlessItsProjectAllows(t *testing.T) {
	t.Parallel()
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	models := hostileDir(t)
	d.apply("projects:\n" + hostileProject("plain", "acme", "mk-plain", models, marker(), "") +
		hostileProject("userns", "acme", "mk-userns", models, marker(), "    allowUserNamespaces: true\n"))
	c := inferenceClient{t: t, base: d.base, key: key}
	if got := ask(t, c, "mk-plain", map[string]any{"userns": true})["userns"]; got != "error: Operation not permitted" {
		t.Errorf("unshare(CLONE_NEWUSER) in a model: %q, want Operation not permitted", got)
	}
	if got := ask(t, c, "mk-userns", map[string]any{"userns": true})["userns"]; got != "ok" {
		t.Errorf("unshare(CLONE_NEWUSER) in a model of a project that allows it: %q, want ok", got)
	}
}
