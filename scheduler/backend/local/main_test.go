package local

import (
	"bytes"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"inferd/internal/testenv"
	"inferd/scheduler/backend"
	"inferd/store"
)

// testDeadline bounds every wait in these tests; a healthy run needs a fraction.
const testDeadline = 15 * time.Second

// TestMain fails the run if a Process goroutine outlives the tests: every process is
// stopped or killed by the end, and its goroutines must end with it.
func TestMain(m *testing.M) {
	restore, err := testenv.ShareTempDirWithModels()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	code := m.Run()
	restore()
	if code == 0 && os.Getenv(helperEnv) == "" {
		if leaked := waitNoProcessGoroutines(5 * time.Second); leaked != "" {
			fmt.Fprintf(os.Stderr, "leaked replica goroutines:\n%s\n", leaked)
			code = 1
		}
	}
	os.Exit(code)
}

// waitNoProcessGoroutines waits until no goroutine runs a *Process method and returns
// the offending stacks if some still do at the deadline.
func waitNoProcessGoroutines(limit time.Duration) string {
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for {
		buf := make([]byte, 1<<20)
		buf = buf[:runtime.Stack(buf, true)]
		var leaked []string
		for _, g := range bytes.Split(buf, []byte("\n\n")) {
			if bytes.Contains(g, []byte("backend/local.(*Process)")) {
				leaked = append(leaked, string(g))
			}
		}
		if len(leaked) == 0 || time.Now().After(deadline) {
			return strings.Join(leaked, "\n\n")
		}
		<-tick.C
	}
}

// python returns the real python3 interpreter (resolving a pyenv shim once, which
// saves about a second per model start), or skips the test when there is none.
var python = sync.OnceValues(func() (string, error) {
	if _, err := exec.LookPath("python3"); err != nil {
		return "", err
	}
	out, err := exec.Command("python3", "-c", "import sys; print(sys.executable)").Output()
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(out)), nil
})

// testBackend returns a backend with its logs and pid files under a test directory,
// whose models run as the test's own user, in the rest of the sandbox this machine
// allows (a cgroup and a network namespace each, as root).
func testBackend(t *testing.T) *Backend {
	t.Helper()
	return testBackendWith(t, func(*Config) {})
}

// testBackendWith is testBackend with the configuration changed by set.
func testBackendWith(t *testing.T, set func(*Config)) *Backend {
	t.Helper()
	dir := t.TempDir()
	cfg := Config{LogDir: filepath.Join(dir, "logs"), RunDir: filepath.Join(dir, "run"), User: "root"}
	set(&cfg)
	b, err := New(cfg, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	return b
}

// hostNetwork puts a test backend's replicas on the host's network, each on a
// loopback port of its own.
func hostNetwork(c *Config) { c.Network = store.NetworkHost }

// modelClient is an HTTP client that reaches p's model the way inferd does
// (from inside its network namespace, if it has one), at modelURL.
func modelClient(p *Process) *http.Client {
	return &http.Client{Timeout: time.Second, Transport: &http.Transport{DialContext: p.dial}}
}

// modelURL is the address of path on p's model, for modelClient.
func modelURL(p *Process, path string) string {
	return "http://127.0.0.1:" + strconv.Itoa(p.port) + path
}

// echoSpec returns a Spec running examples/echo/server.py, or skips the test when
// python3 is absent.
func echoSpec(t *testing.T, id string) backend.Spec {
	t.Helper()
	py, err := python()
	if err != nil {
		testenv.Missing(t, "python3 on PATH, to run examples/echo: %v", err)
	}
	server, err := filepath.Abs("../../../examples/echo/server.py")
	if err != nil {
		t.Fatal(err)
	}
	return backend.Spec{
		ReplicaID: id,
		ProjectID: "proj-" + id,
		TeamID:    "team",
		Model:     store.ModelSpec{Command: []string{py, server}, Dir: t.TempDir()},
	}
}

// shSpec returns a Spec running a shell script.
func shSpec(id, script string) backend.Spec {
	return backend.Spec{
		ReplicaID: id,
		ProjectID: "proj-" + id,
		TeamID:    "team",
		Model:     store.ModelSpec{Command: []string{"sh", "-c", script}},
	}
}

// startModel starts spec on b and stops the process when the test ends.
func startModel(t *testing.T, b *Backend, spec backend.Spec) *Process {
	t.Helper()
	p, err := b.start(spec)
	if err != nil {
		t.Fatalf("start: %v", err)
	}
	t.Cleanup(func() { p.stop(5 * time.Second) })
	return p
}

// startReady starts spec on b and waits until the model is ready.
func startReady(t *testing.T, b *Backend, spec backend.Spec) *Process {
	t.Helper()
	p := startModel(t, b, spec)
	waitReady(t, p)
	return p
}

func waitReady(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.Ready():
	case <-p.Exited():
		t.Fatalf("model exited before ready: %v; last line %q", p.ExitErr(), p.LastLogLine())
	case <-time.After(testDeadline):
		t.Fatalf("model not ready after %v; last line %q", testDeadline, p.LastLogLine())
	}
}

func waitExited(t *testing.T, p *Process) {
	t.Helper()
	select {
	case <-p.Exited():
	case <-time.After(testDeadline):
		t.Fatalf("model still running after %v; last line %q", testDeadline, p.LastLogLine())
	}
}

// testLogger writes the package's log lines to the test log.
func testLogger(t testing.TB) zerolog.Logger {
	return zerolog.New(zerolog.NewTestWriter(t))
}

// processGone reports whether pid no longer runs; a zombie (dead, not yet reaped by
// whoever inherited it) counts as gone.
func processGone(pid int) bool {
	if err := syscall.Kill(pid, 0); err == syscall.ESRCH {
		return true
	}
	_, state, ok := procStat(pid)
	return !ok || state == 'Z'
}

// waitGone waits until pid is gone. The process is not our child, so there is no
// event to wait on: poll until the deadline.
func waitGone(t *testing.T, pid int) {
	t.Helper()
	deadline := time.Now().Add(testDeadline)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !processGone(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still alive after %v", pid, testDeadline)
		}
		<-tick.C
	}
}

// seenPid is the pid p's model sees itself as (os.getpid()): in a PID
// namespace of its own it is the init's child, numbered there; else the
// leader the daemon started.
func seenPid(t *testing.T, p *Process) int {
	t.Helper()
	if !p.box.namespaces {
		return p.pid
	}
	children, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%d/children", p.pid, p.pid))
	f := strings.Fields(string(children))
	if err != nil || len(f) != 1 {
		t.Fatalf("the init's children: %q, %v; want one, the model", children, err)
	}
	status, err := os.ReadFile("/proc/" + f[0] + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if ids, ok := strings.CutPrefix(line, "NSpid:"); ok {
			ns := strings.Fields(ids)
			pid, _ := strconv.Atoi(ns[len(ns)-1])
			return pid
		}
	}
	t.Fatalf("no NSpid in /proc/%s/status", f[0])
	return 0
}

// hostPid is the pid, as this test sees it, of the process p's model
// knows as nsPid (a pid it printed): the same number without a PID
// namespace. Call it while that process lives.
func hostPid(t *testing.T, p *Process, nsPid int) int {
	t.Helper()
	if !p.box.namespaces {
		return nsPid
	}
	ns, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/pid", p.pid))
	if err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if other, _ := os.Readlink("/proc/" + e.Name() + "/ns/pid"); other != ns {
			continue
		}
		status, _ := os.ReadFile("/proc/" + e.Name() + "/status")
		for _, line := range strings.Split(string(status), "\n") {
			if ids, ok := strings.CutPrefix(line, "NSpid:"); ok {
				if f := strings.Fields(ids); len(f) > 0 && f[len(f)-1] == strconv.Itoa(nsPid) {
					return pid
				}
			}
		}
	}
	t.Fatalf("no process is pid %d in replica %s's PID namespace", nsPid, p.spec.ReplicaID)
	return 0
}

// noNamespaces makes b start replicas without PID and mount namespaces, as
// on a machine where inferd lacks CAP_SYS_ADMIN.
func noNamespaces(b *Backend) { b.sb.nsErr = errors.New("turned off for this test") }

// waitFor is the shared poller (internal/testenv).
var waitFor = testenv.WaitFor

func closed(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}
