package e2e

// The end-to-end harness: it builds the real inferd binary (the module root's
// package main) once (with the race detector and the failpoints, inert
// unless a fault test arms one), starts it as a separate process on a free port with a
// fresh data dir, and talks to it over real HTTP and the real CLI. Model servers are the real examples.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"inferd/internal/testenv"
)

var inferdBin string

func TestMain(m *testing.M) {
	if size := os.Getenv(copyServerEnv); size != "" {
		os.Exit(serveCopyMain(size)) // a helper process of payloads_test.go
	}
	// The tests name the repository's files (examples/, scripts/, web/) from
	// the module root and build the binary there: run them from it.
	if err := os.Chdir(".."); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if _, ok := inThrowawayRoot(); ok {
		os.Exit(m.Run()) // the package test's copy: it runs the packaged binary
	}
	// Every deadline of the run is stretched alike, by a factor decided
	// now: a busy machine's load average, or INFERD_TEST_SLACK.
	fmt.Fprintln(os.Stderr, "e2e:", testenv.SlackReport())
	// As root each replica has a /tmp of its own: the files tests share
	// with models (and the models themselves) go where models see them.
	restore, err := testenv.ShareTempDirWithModels()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	dir, err := os.MkdirTemp("", "inferd-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	inferdBin = filepath.Join(dir, "inferd")
	flag.Parse()
	if flag.Lookup("test.run").Value.String() == "" {
		// A whole run (make test) has the package and payload tests: their
		// build goes along with this one rather than hold them up later.
		go packagedBuild.once.Do(buildPackaged)
	}
	// The one build every test runs (but the package and payload tests,
	// which run the production build: packaged). The failpoints are inert
	// unless INFERD_FAILPOINT names one (store/bolt/failpoint.go), so the
	// fault tests need no build of their own.
	build := exec.Command("go", "build", "-race", "-tags", "failpoints", "-o", inferdBin, ".")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "build inferd:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code != 0 {
		// Whatever failed, say how loaded the machine was: a test that
		// passes when run again alone most likely met the load.
		fmt.Fprintln(os.Stderr, "e2e: failed on a machine at", testenv.Load())
	}
	os.RemoveAll(dir)
	restore()
	os.Exit(code)
}

// daemon is one running inferd process.
type daemon struct {
	t       *testing.T
	dir     string // holds config.yaml and data/
	cfgPath string
	base    string // http://127.0.0.1:PORT
	cmd     *exec.Cmd
	logs    *lineLog
	exited  chan struct{}
}

// lineLog collects the daemon's stderr and lets a test wait for a line.
type lineLog struct {
	mu    sync.Mutex
	lines []string
	grew  chan struct{}
}

func (l *lineLog) add(line string) {
	l.mu.Lock()
	l.lines = append(l.lines, line)
	close(l.grew)
	l.grew = make(chan struct{})
	l.mu.Unlock()
}

// waitFor blocks until a line containing substr has been logged, or fails t
// after timeout (stretched by testenv.Scale on a busy machine).
func (l *lineLog) waitFor(t *testing.T, substr string, timeout time.Duration) string {
	t.Helper()
	return l.waitForAll(t, timeout, substr)
}

// waitForAll blocks until a line containing every one of subs has been
// logged (a JSON line's message and one of its fields).
func (l *lineLog) waitForAll(t *testing.T, timeout time.Duration, subs ...string) string {
	t.Helper()
	deadline := time.NewTimer(testenv.Scale(timeout))
	defer deadline.Stop()
	seen := 0
	for {
		l.mu.Lock()
		for ; seen < len(l.lines); seen++ {
			all := true
			for _, s := range subs {
				all = all && strings.Contains(l.lines[seen], s)
			}
			if all {
				line := l.lines[seen]
				l.mu.Unlock()
				return line
			}
		}
		grew := l.grew
		l.mu.Unlock()
		select {
		case <-grew:
		case <-deadline.C:
			t.Fatalf("%s; log:\n%s", testenv.Waited(timeout, fmt.Sprintf("a log line containing %q", subs)), l.String())
		}
	}
}

// linesWith returns the last n lines containing substr, for a failure
// message.
func (l *lineLog) linesWith(substr string, n int) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, line := range l.lines {
		if strings.Contains(line, substr) {
			out = append(out, line)
		}
	}
	return strings.Join(out[max(len(out)-n, 0):], "\n")
}

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// newDaemonDir writes a config for a fresh data dir; extra YAML is appended.
func newDaemonDir(t *testing.T, extra string) (dir, cfgPath string) {
	t.Helper()
	dir = t.TempDir()
	cfg := fmt.Sprintf("listen: 127.0.0.1:%d\ndataDir: ./data\nlog:\n  format: json\n  level: debug\n%s", freePort(t), extra)
	cfgPath = filepath.Join(dir, "config.yaml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir, cfgPath
}

// startDaemon starts `inferd serve` on the config in dir and waits until it serves.
// Model processes run as the test's user even when that is root (replica.user:
// root): python3 and the examples may live where an unprivileged user cannot
// read them (a pyenv under /root). TestModelProcessesAreConfined covers the
// default, an unprivileged model user, with startDaemonEnv.
func startDaemon(t *testing.T, dir, cfgPath string) *daemon {
	t.Helper()
	return startDaemonWith(t, dir, cfgPath, inferdBin, "INFERD_REPLICA_USER=root")
}

// startDaemonEnv is startDaemon with extra NAME=value environment variables
// and the default model user.
func startDaemonEnv(t *testing.T, dir, cfgPath string, env ...string) *daemon {
	t.Helper()
	return startDaemonWith(t, dir, cfgPath, inferdBin, env...)
}

// startDaemonWith is startDaemonEnv with another inferd binary (such as one
// built with failpoints).
func startDaemonWith(t *testing.T, dir, cfgPath, bin string, env ...string) *daemon {
	t.Helper()
	cmd := exec.Command(bin, "--config", cfgPath, "serve")
	cmd.Env = append(append(os.Environ(), "INFERD_SECRET_PROBE=must-not-leak"), env...)
	return startDaemonCmd(t, cmd, dir, cfgPath)
}

// startDaemonCmd starts cmd, an `inferd serve` logging JSON to stderr, and
// waits until it serves.
func startDaemonCmd(t *testing.T, cmd *exec.Cmd, dir, cfgPath string) *daemon {
	t.Helper()
	d := launchDaemonCmd(t, cmd, dir, cfgPath)
	d.waitServing(t, 30*time.Second)
	return d
}

// launchDaemonCmd starts cmd as startDaemonCmd does but does not wait for it
// to serve: the members of a new etcd cluster serve only once a quorum of
// them runs, so a test starts them all before waiting on any.
func launchDaemonCmd(t *testing.T, cmd *exec.Cmd, dir, cfgPath string) *daemon {
	t.Helper()
	d := &daemon{t: t, dir: dir, cfgPath: cfgPath, cmd: cmd, logs: &lineLog{grew: make(chan struct{})}, exited: make(chan struct{})}
	stderr, err := d.cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := d.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		for sc.Scan() {
			d.logs.add(sc.Text())
		}
		d.cmd.Wait()
		close(d.exited)
	}()
	t.Cleanup(func() { d.stop() })
	return d
}

// waitServing waits until the daemon logs that it serves and reads its
// address into d.base.
func (d *daemon) waitServing(t *testing.T, timeout time.Duration) {
	t.Helper()
	line := d.logs.waitFor(t, `"inferd serving"`, timeout)
	var entry struct{ Listen string }
	if err := json.Unmarshal([]byte(line), &entry); err != nil || entry.Listen == "" {
		t.Fatalf("cannot read the listen address from %q: %v", line, err)
	}
	d.base = entry.Listen
}

// stop sends SIGTERM and waits for a graceful exit.
func (d *daemon) stop() {
	select {
	case <-d.exited:
		return
	default:
	}
	d.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-d.exited:
	case <-scaledAfter(60 * time.Second):
		d.cmd.Process.Kill()
		<-d.exited
		d.t.Error(testenv.Waited(60*time.Second, "inferd to stop after SIGTERM"))
	}
}

// kill sends SIGKILL: no cleanup of any kind runs in the daemon.
func (d *daemon) kill() {
	d.cmd.Process.Kill()
	<-d.exited
}

// cli runs an admin command against this daemon's config.
func (d *daemon) cli(args ...string) (string, error) {
	return runCLI(d.cfgPath, args...)
}

func runCLI(cfgPath string, args ...string) (string, error) {
	cmd := exec.Command(inferdBin, append([]string{"--config", cfgPath}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("inferd %s: %v: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// createKey makes a key with the CLI and returns the secret (the last line).
func (d *daemon) createKey(team string, admin bool) string {
	d.t.Helper()
	args := []string{"key", "create", "--team", team}
	if admin {
		args = append(args, "--admin")
	}
	out, err := d.cli(args...)
	if err != nil {
		d.t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	return lines[len(lines)-1]
}

// apply writes a manifest beside the config and applies it.
func (d *daemon) apply(manifest string) string {
	d.t.Helper()
	path := filepath.Join(d.dir, fmt.Sprintf("manifest-%d.yaml", time.Now().UnixNano()))
	if err := os.WriteFile(path, []byte(manifest), 0o600); err != nil {
		d.t.Fatal(err)
	}
	out, err := d.cli("apply", "-f", path)
	if err != nil {
		d.t.Fatal(err)
	}
	return out
}

// do sends a request and returns the status and decoded JSON object.
func do(t *testing.T, method, url string, headers map[string]string, body string) (int, map[string]any) {
	t.Helper()
	status, obj, err := tryDo(method, url, headers, body)
	if err != nil {
		t.Fatal(err)
	}
	return status, obj
}

// tryDo is do for a goroutine other than the test's, which must not call
// t.Fatal: it returns the failure instead.
func tryDo(method, url string, headers map[string]string, body string) (int, map[string]any, error) {
	status, raw, err := tryDoRaw(method, url, headers, body)
	if err != nil {
		return 0, nil, err
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return 0, nil, fmt.Errorf("%s %s: answer is not a JSON object (%v): %q", method, url, err, raw)
	}
	return status, obj, nil
}

func doRaw(t *testing.T, method, url string, headers map[string]string, body string) (int, []byte) {
	t.Helper()
	status, raw, err := tryDoRaw(method, url, headers, body)
	if err != nil {
		t.Fatal(err)
	}
	return status, raw
}

func tryDoRaw(method, url string, headers map[string]string, body string) (int, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(2*time.Minute))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	for k, v := range headers {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: %w", method, url, err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, nil, fmt.Errorf("%s %s: read the answer: %w", method, url, err)
	}
	return resp.StatusCode, raw, nil
}

// marker is a unique value put in a project's env, so the test can find that
// project's model processes in /proc and prove none is left behind.
func marker() string {
	b := make([]byte, 8)
	rand.Read(b)
	return "m" + hex.EncodeToString(b)
}

// processesWithEnv lists live pids whose environment contains E2E_MARKER=m.
func processesWithEnv(m string) []int { return processesWithEnvVar("E2E_MARKER", m) }

// processesWithEnvVar lists live pids whose environment has name=value.
func processesWithEnvVar(name, value string) []int {
	entries, _ := os.ReadDir("/proc")
	want := []byte(name + "=" + value + "\x00")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, want) {
			continue
		}
		if stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat")); err == nil && isZombie(stat) {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

func readEnviron(pid int) string {
	env, _ := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "environ"))
	return string(env)
}

func isZombie(stat []byte) bool {
	i := bytes.LastIndexByte(stat, ')')
	return i > 0 && i+2 < len(stat) && stat[i+2] == 'Z'
}

// eventually retries cond until it holds or the timeout (stretched by
// testenv.Scale on a busy machine) passes. Used only for conditions that
// have no signal of their own to wait on, such as a process disappearing
// from /proc after the daemon that owned it was killed.
func eventually(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	testenv.Eventually(t, timeout, what, cond)
}

// scaledAfter is time.After for a test's deadline: d on a quiet machine,
// stretched by testenv.Scale on a busy one. A test that runs out of it
// says so with testenv.Waited(d, what).
func scaledAfter(d time.Duration) <-chan time.Time { return time.After(testenv.Scale(d)) }

// scaledSetting is d stretched by testenv.Scale, written as a config
// duration: for a daemon setting that only bounds how long a test's call
// may take on a busy machine (the startWait a sync call must finish
// within, the timeout a hanging receiver must outlast), never for the rule
// the test checks. It is at most 10 minutes, the most the config takes
// for a wait (startWait, longPollWait).
func scaledSetting(d time.Duration) string {
	return min(testenv.Scale(d), 10*time.Minute).Round(time.Millisecond).String()
}

// scaledSeconds is scaledSetting for a setting in whole seconds (a
// manifest's bootTimeout or inferenceTimeout), rounded up.
func scaledSeconds(d time.Duration) int {
	return int((testenv.Scale(d) + time.Second - 1) / time.Second)
}

// shippedManifest returns a copy of the example manifest at path (an
// examples/*/project.yaml, applied as shipped) whose bootTimeout and
// inferenceTimeout are stretched by testenv.Scale, its relative dir made
// absolute: a model that imports PyTorch takes seconds to boot on a quiet
// machine and minutes on a busy one, past the bound a user's box needs.
func shippedManifest(t *testing.T, path string) string {
	t.Helper()
	abs, err := filepath.Abs(path)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(abs)
	if err != nil {
		t.Fatal(err)
	}
	timeout := regexp.MustCompile(`(?m)^(\s+(?:bootTimeout|inferenceTimeout)): (\d+)`)
	text := timeout.ReplaceAllStringFunc(string(b), func(line string) string {
		m := timeout.FindStringSubmatch(line)
		secs, _ := strconv.Atoi(m[2])
		return fmt.Sprintf("%s: %d", m[1], scaledSeconds(time.Duration(secs)*time.Second))
	})
	text = regexp.MustCompile(`(?m)^(\s+dir:) \.$`).ReplaceAllString(text, "$1 "+filepath.Dir(abs))
	out := filepath.Join(t.TempDir(), filepath.Base(abs))
	if err := os.WriteFile(out, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

// sleepInputs is the echo model's inputs for a call that runs for d,
// stretched by testenv.Scale: a call a test needs still running while it
// looks (a queue behind it, a cancel, a kill) must outlast the looking,
// however busy the machine.
func sleepInputs(d time.Duration) string {
	return fmt.Sprintf(`{"sleep":%.1f}`, testenv.Scale(d).Seconds())
}

func echoDir(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("examples/echo")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3 on PATH: the echo example needs it")
	}
	return dir
}

// replicaStates returns the states of project's replicas as /v1/status shows
// them to key ("booting", "ready", "busy", "stopping"). Tests wait on it for a
// replica to be ready instead of guessing how long a boot takes on a busy box.
func (d *daemon) replicaStates(key, project string) []string {
	d.t.Helper()
	code, body := doRaw(d.t, "GET", d.base+"/v1/status/projects", map[string]string{"X-Service-API-Key": key}, "")
	if code != http.StatusOK {
		d.t.Fatalf("status of %s: HTTP %d %s", project, code, body)
	}
	var all struct {
		Results []struct {
			ID       string `json:"id"`
			Replicas []struct {
				State string `json:"state"`
			} `json:"replicas"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &all); err != nil {
		d.t.Fatalf("status of %s: %v in %s", project, err, body)
	}
	var states []string
	for _, p := range all.Results {
		if p.ID != project {
			continue
		}
		for _, r := range p.Replicas {
			states = append(states, r.State)
		}
	}
	return states
}
