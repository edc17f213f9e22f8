package e2e

// The first hour of a newcomer (issue 29): the demo as make run, the
// README's restart and doctor run it; re-applies that keep what the project
// API set; a second make run that changes nothing; a project the others'
// minimums leave no room; the messages on the way.

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// TestReapplyKeepsWhatTheProjectAPISet: a re-apply of the same manifest
// leaves an idleTimeout set through PUT /v1/projects as it is; a manifest
// that changes another field changes that one alone; and make run's apply
// (--offline) refuses while the daemon serves, before it changes anything.
func TestReapplyKeepsWhatTheProjectAPISet(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	mark := marker()
	manifest := func(inferenceTimeout int) string {
		return "projects:\n" + echoProject("echo", "acme", "mk-echo", echo, mark, "") +
			fmt.Sprintf("    idleTimeout: 30\n    inferenceTimeout: %d\n", inferenceTimeout)
	}
	d.apply(manifest(300))
	project := func() map[string]any {
		t.Helper()
		status, p := do(t, "GET", d.base+"/v1/projects/echo", map[string]string{"X-Service-API-Key": key}, "")
		if status != 200 {
			t.Fatalf("GET /v1/projects/echo: %d %v", status, p)
		}
		return p
	}
	if status, p := do(t, "PUT", d.base+"/v1/projects/echo", map[string]string{"X-Service-API-Key": key}, `{"idleTimeout": 600}`); status != 200 {
		t.Fatalf("PUT idleTimeout: %d %v", status, p)
	}

	if out := d.apply(manifest(300)); !strings.Contains(out, "project echo (team acme): unchanged") {
		t.Errorf("re-apply of the same manifest:\n%s", out)
	}
	if p := project(); p["idleTimeout"] != 600.0 {
		t.Errorf("after a re-apply idleTimeout = %v, want the project API's 600", p["idleTimeout"])
	}
	if out := d.apply(manifest(60)); !strings.Contains(out, "project echo (team acme): updated") {
		t.Errorf("apply of a changed manifest:\n%s", out)
	}
	if p := project(); p["idleTimeout"] != 600.0 || p["inferenceTimeout"] != 60.0 {
		t.Errorf("after the manifest changed inferenceTimeout: %v, want idleTimeout 600 and inferenceTimeout 60", p)
	}

	// make run's apply, as a second make run would run it: it stops before
	// it changes anything.
	changed := filepath.Join(dir, "changed.yaml")
	if err := os.WriteFile(changed, []byte(manifest(5)), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := d.cli("apply", "--offline", "-f", changed)
	if err == nil || !strings.Contains(err.Error(), "already serves") || !strings.Contains(err.Error(), "nothing was applied") {
		t.Errorf("apply --offline while the daemon serves: %v\n%s", err, out)
	}
	if p := project(); p["inferenceTimeout"] != 60.0 {
		t.Errorf("the refused apply changed inferenceTimeout to %v", p["inferenceTimeout"])
	}
	mk, err := exec.Command("make", "-n", "run").Output()
	if err != nil {
		t.Fatalf("make -n run: %v", err)
	}
	lines := strings.Split(string(mk), "\n")
	applyAt := slices.IndexFunc(lines, func(l string) bool { return strings.Contains(l, " apply ") })
	serveAt := slices.IndexFunc(lines, func(l string) bool { return strings.HasSuffix(l, " serve") })
	if applyAt < 0 || serveAt < applyAt || !strings.Contains(lines[applyAt], "--offline") {
		t.Errorf("make run should apply with --offline before it serves:\n%s", mk)
	}
}

// TestProjectHeldOutByMinimumsIsReported: three CPU projects on two CPU
// slots, two with minReplicas 1 (one of them labs'), leave acme's third no
// slot for good. apply, doctor and the daemon's log (the operator's) name
// the holders; its call, queued, says why beside its state, and the status
// says it too, without naming labs' project to acme's key (another team's
// project is never revealed to exist); an admin key's status names it.
func TestProjectHeldOutByMinimumsIsReported(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "cpuSlots: 2\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	out := d.apply("projects:\n" +
		echoProject("a", "acme", "mk-a", echo, marker(), "") + "    minReplicas: 1\n" +
		echoProject("labsmin", "labs", "mk-labsmin", echo, marker(), "") + "    minReplicas: 1\n" +
		echoProject("c", "acme", "mk-c", echo, marker(), ""))
	const named = "no CPU slot: the minReplicas of projects a, labsmin hold all 2 cpuSlots"
	const unnamed = "no CPU slot: other projects' minReplicas hold all 2 cpuSlots"
	if !strings.Contains(out, "warning: project c can never run a call: "+named) {
		t.Errorf("apply does not warn that c gets no slot:\n%s", out)
	}
	c := inferenceClient{t: t, base: d.base, key: key}
	id := c.start("mk-c", `{}`, true)["callID"].(string)
	r := c.check(id, false)
	wf, _ := r["waitingFor"].(map[string]any)
	if r["message"] != "queued" || wf["code"] != "heldByMinimums" || wf["text"] != unnamed {
		t.Errorf("check of c's call = %v; want message queued and waitingFor {heldByMinimums, %q}", r, unnamed)
	}
	_, body := doRaw(t, "GET", d.base+"/v1/status", map[string]string{"X-Service-API-Key": key}, "")
	if strings.Contains(string(body), "labsmin") || !strings.Contains(string(body), unnamed) {
		t.Errorf("acme's status names labs' project, or not why c waits:\n%s", body)
	}
	if got := d.statusWaiting(d.createKey("ops", true), "c"); got != named {
		t.Errorf("the admin's status of c: waiting %q, want %q", got, named)
	}
	d.logs.waitFor(t, named, 10*time.Second)
	doc, _ := d.cli("doctor")
	if !strings.Contains(doc, "warn  capacity     project c can never run a call: "+named) {
		t.Errorf("doctor does not name c:\n%s", doc)
	}
}

// TestTheDemoRunsAsTheREADMERestartsIt: the example as make run applies it
// runs under the README's own `inferd --config config.example.yaml serve`
// (with make run's INFERD_REPLICA_USER only where other users cannot read
// this checkout: scripts/demo-user.sh), as root under a uid of the
// project's own, even where the first python3 on PATH is one that uid
// cannot run (a pyenv under /root); doctor with that config passes on it,
// its columns lined up. Its log gives durations with their unit.
func TestTheDemoRunsAsTheREADMERestartsIt(t *testing.T) {
	t.Parallel()
	echoDir(t)
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testenv.Missing(t, "/usr/bin/python3, which the example runs on")
	}
	demoUser, err := exec.Command("scripts/demo-user.sh").Output()
	if err != nil {
		t.Fatalf("scripts/demo-user.sh: %v", err)
	}
	env := os.Environ()
	if u := strings.TrimSpace(string(demoUser)); u != "" {
		env = append(env, "INFERD_REPLICA_USER="+u) // as make run says it restarts
	}
	// A python3 first on PATH that no other user may run, as a pyenv
	// under /root is.
	private := t.TempDir() // mode 0700
	if err := os.Symlink("/usr/bin/python3", filepath.Join(private, "python3")); err != nil {
		t.Fatal(err)
	}
	env = append(env, "PATH="+private+":"+os.Getenv("PATH"))

	dir := t.TempDir()
	example, err := os.ReadFile("config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "config.yaml")
	text := strings.Replace(string(example), "\nlisten: 127.0.0.1:8080\n", fmt.Sprintf("\nlisten: 127.0.0.1:%d\n", freePort(t)), 1)
	if err := os.WriteFile(cfg, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	run := func(args ...string) (string, error) {
		cmd := exec.Command(inferdBin, append([]string{"--config", cfg}, args...)...)
		cmd.Env = env
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run("apply", "--offline", "-f", "examples/projects.yaml"); err != nil {
		t.Fatalf("make run's apply with the per-project model user: %v\n%s", err, out)
	}
	serve := exec.Command(inferdBin, "--config", cfg, "serve")
	serve.Env = env
	d := startDaemonCmd(t, serve, dir, cfg)
	c := inferenceClient{t: t, base: d.base, key: d.createKey("demo", false)}
	r := c.start("mk-echo-1", `{"prompt": "hi"}`, false)
	if r["message"] != "success" || output(t, r)["greeting"] != "hello from inferd" {
		t.Fatalf("the demo's call: %v", r)
	}
	ready := d.logs.waitFor(t, `"replica ready"`, 10*time.Second)
	var entry struct{ Boot any }
	if err := json.Unmarshal([]byte(ready), &entry); err != nil || !regexp.MustCompile(`^[0-9.]+(ms|s)$`).MatchString(fmt.Sprint(entry.Boot)) {
		t.Errorf("the replica ready line gives boot %v, want a duration with its unit: %s", entry.Boot, ready)
	}

	doc, err := run("doctor")
	if err != nil {
		t.Errorf("doctor on the running demo failed: %v\n%s", err, doc)
	}
	wants := []string{"ok    example      ", "ok    project      echo: dir, command and model user ok"}
	if os.Geteuid() == 0 && len(demoUser) == 0 {
		wants = append(wants, "ok    model user   a uid per project")
	}
	for _, want := range wants {
		if !strings.Contains(doc, want) {
			t.Errorf("doctor lacks %q:\n%s", want, doc)
		}
	}
	for _, line := range strings.Split(strings.TrimSpace(doc), "\n") {
		// status (4) + 2 + check name (12) + 1: every finding starts at 19.
		if len(line) < 20 || line[18] != ' ' || line[19] == ' ' {
			t.Errorf("doctor's columns do not line up at %q", line)
		}
	}

	d.stop()
	if line := d.logs.waitFor(t, "shutting down", time.Second); !strings.Contains(line, `"shutdownTimeout":"30s"`) {
		t.Errorf("the shutdown line gives no unit: %s", line)
	}
}

// TestPortInUseSaysHowToServeElsewhere: a daemon whose address is taken
// names it once and says how to serve on another.
func TestPortInUseSaysHowToServeElsewhere(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	addr := ln.Addr().String()
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfg, []byte("listen: "+addr+"\ndataDir: ./data\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(inferdBin, "--config", cfg, "serve").CombinedOutput()
	if err == nil {
		t.Fatal("serve on a taken address started")
	}
	msg := string(out)
	if strings.Count(msg, addr) != 1 || !strings.Contains(msg, "inferd --listen HOST:PORT serve") || !strings.Contains(msg, "another program listens there") {
		t.Errorf("serve on a taken address said:\n%s", msg)
	}
}

// TestMakeDigitsDepsInstallsWithoutRecommends: make digits-deps asks apt for
// the digits example's packages without their recommends (apt, dpkg-query
// and sudo are stand-ins that record what they are asked).
func TestMakeDigitsDepsInstallsWithoutRecommends(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	bin := t.TempDir()
	record := filepath.Join(bin, "apt.log")
	fakes := map[string]string{
		"apt-get":    `echo "$*" >>` + record,
		"dpkg-query": "exit 1", // nothing is installed
		"sudo":       `[ "$1" = -n ] && shift; exec "$@"`,
	}
	for name, body := range fakes {
		if err := os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command("make", "-s", "digits-deps")
	cmd.Env = append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("make digits-deps: %v\n%s", err, out)
	}
	got, _ := os.ReadFile(record)
	if !regexp.MustCompile(`(?m)^-o DPkg::Lock::Timeout=\d+ install -y -q --no-install-recommends python3-torch python3-sklearn$`).Match(got) {
		t.Errorf("apt-get was asked:\n%s", got)
	}
}
