package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/scheduler/backend"
)

// echoReply is what examples/echo answers to a plain call.
type echoReply struct {
	Echo     map[string]any `json:"echo"`
	Greeting *string        `json:"greeting"`
	Replica  string         `json:"replica"`
	Pid      int            `json:"pid"`
	Env      *string        `json:"env"`
	Data     string         `json:"data"`
	Child    int            `json:"child"`
}

func infer(t *testing.T, p *Process, inputs string) echoReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	out, err := p.Infer(ctx, backend.Request{Inputs: json.RawMessage(inputs)})
	if err != nil {
		t.Fatalf("Infer(%s): %v", inputs, err)
	}
	var r echoReply
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("reply %s: %v", out, err)
	}
	return r
}

func TestStartedModelBecomesReadyAndEchoes(t *testing.T) {
	b := testBackend(t)
	spec := echoSpec(t, "echo-1")
	spec.Model.Env = map[string]string{"GREETING": "hello"}
	p := startReady(t, b, spec)

	if p.Info().Pid != p.pid || p.pid <= 0 || p.port <= 0 {
		t.Fatalf("Info, Pid, Port = %+v, %d, %d", p.Info(), p.pid, p.port)
	}
	for i := range 3 { // repeated calls share a kept-alive connection
		r := infer(t, p, fmt.Sprintf(`{"n": %d, "text": "hi"}`, i))
		if r.Echo["n"] != float64(i) || r.Echo["text"] != "hi" {
			t.Errorf("echo = %v", r.Echo)
		}
		if r.Greeting == nil || *r.Greeting != "hello" || r.Replica != "echo-1" || r.Pid != seenPid(t, p) {
			t.Errorf("greeting, replica, pid = %v, %q, %d; want hello, echo-1, %d", r.Greeting, r.Replica, r.Pid, seenPid(t, p))
		}
	}
	if got := p.LastLogLine(); got != fmt.Sprintf("echo model listening on 127.0.0.1:%d", p.port) {
		t.Errorf("LastLogLine = %q", got)
	}
	pidFile := b.cfg.RunDir + "/echo-1.pid"
	rec, err := readPidFile(pidFile)
	if err != nil || rec.Pid != p.pid || rec.Pgid != p.pid || rec.ID != "echo-1" {
		t.Errorf("pid file = %+v, %v", rec, err)
	}

	p.stop(5 * time.Second)
	if !closed(p.Exited()) {
		t.Fatal("Stop returned before Exited")
	}
	if err := p.ExitErr(); err != nil {
		t.Errorf("ExitErr after SIGTERM = %v, want nil (echo exits 0)", err)
	}
	if _, err := os.Stat(pidFile); !os.IsNotExist(err) {
		t.Errorf("pid file still there after exit: %v", err)
	}
	logPath := filepath.Join(b.cfg.LogDir, "team", "proj-echo-1", "echo-1.log")
	if log, _ := os.ReadFile(logPath); !strings.Contains(string(log), "echo model listening") {
		t.Errorf("log file %s = %q", logPath, log)
	}
	if _, err := p.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)}); !errors.Is(err, backend.ErrExited) {
		t.Errorf("Infer after Stop = %v, want ErrExited", err)
	}
}

func TestModelSeesOnlyAllowlistedEnvironment(t *testing.T) {
	t.Setenv("INFERD_SECRET_TEST", "ik_do_not_leak")
	t.Setenv("SOME_DAEMON_SETTING", "x")
	spec := echoSpec(t, "env-1")
	spec.ProjectID = "proj-env"
	spec.GPUs = []string{"GPU-1111", "GPU-2222"}
	spec.Model.Env = map[string]string{"GREETING": "hi"}
	p := startReady(t, testBackend(t), spec)

	tests := []struct {
		name string
		want *string // nil = unset
	}{
		{"PORT", ptr(strconv.Itoa(p.port))},
		{"INFERD_REPLICA_ID", ptr("env-1")},
		{"INFERD_PROJECT_ID", ptr("proj-env")},
		{"CUDA_VISIBLE_DEVICES", ptr("GPU-1111,GPU-2222")},
		{"NVIDIA_VISIBLE_DEVICES", ptr("GPU-1111,GPU-2222")},
		{"PYTHONUNBUFFERED", ptr("1")},
		{"GREETING", ptr("hi")},
		{"PATH", ptr(os.Getenv("PATH"))},
		{"INFERD_SECRET_TEST", nil},
		{"SOME_DAEMON_SETTING", nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := infer(t, p, fmt.Sprintf(`{"env": %q}`, tc.name)).Env
			switch {
			case tc.want == nil && got != nil:
				t.Errorf("model sees %s=%q", tc.name, *got)
			case tc.want != nil && (got == nil || *got != *tc.want):
				t.Errorf("%s = %v, want %q", tc.name, deref(got), *tc.want)
			}
		})
	}
}

func ptr(s string) *string { return &s }

func deref(s *string) any {
	if s == nil {
		return nil
	}
	return *s
}

func TestInferReportsModelFailures(t *testing.T) {
	b := testBackend(t)
	b.maxReplyBytes = 1 << 20 // a 64 MiB reply would make a slow test
	p := startReady(t, b, echoSpec(t, "errs-1"))

	tests := []struct {
		name    string
		inputs  string
		timeout time.Duration
		check   func(t *testing.T, out json.RawMessage, err error)
	}{
		{
			name:   "500 becomes HTTPError with body",
			inputs: `{"fail": "out of cheese"}`,
			check: func(t *testing.T, _ json.RawMessage, err error) {
				var he *backend.HTTPError
				if !errors.As(err, &he) || he.Status != 500 || he.Body != `{"error": "out of cheese"}` {
					t.Fatalf("err = %#v, want HTTPError 500 with the body", err)
				}
			},
		},
		{
			name:   "bad inputs become HTTPError 400",
			inputs: `[1, 2]`,
			check: func(t *testing.T, _ json.RawMessage, err error) {
				var he *backend.HTTPError
				if !errors.As(err, &he) || he.Status != 400 || !strings.Contains(he.Body, "must be a JSON object") {
					t.Fatalf("err = %v, want HTTPError 400", err)
				}
			},
		},
		{
			name:   "non-JSON reply is invalid",
			inputs: `{"raw": "plain text"}`,
			check: func(t *testing.T, _ json.RawMessage, err error) {
				if !errors.Is(err, backend.ErrInvalidReply) || !strings.Contains(err.Error(), "plain text") {
					t.Fatalf("err = %v, want ErrInvalidReply quoting the reply", err)
				}
			},
		},
		{
			name:   "reply under the cap",
			inputs: `{"bytes": 500000}`,
			check: func(t *testing.T, out json.RawMessage, err error) {
				if err != nil || len(out) < 500000 {
					t.Fatalf("Infer = %d bytes, %v", len(out), err)
				}
			},
		},
		{
			name:   "reply over the cap",
			inputs: `{"bytes": 2000000}`,
			check: func(t *testing.T, _ json.RawMessage, err error) {
				if !errors.Is(err, backend.ErrInvalidReply) || !strings.Contains(err.Error(), "larger than") {
					t.Fatalf("err = %v, want ErrInvalidReply for size", err)
				}
			},
		},
		{
			name:    "hang ends with the context's error",
			inputs:  `{"hang": true}`,
			timeout: 200 * time.Millisecond,
			check: func(t *testing.T, _ json.RawMessage, err error) {
				if err != context.DeadlineExceeded {
					t.Fatalf("err = %v, want context.DeadlineExceeded as is", err)
				}
			},
		},
		{
			name:   "still answers after all that",
			inputs: `{"ok": 1}`,
			check: func(t *testing.T, out json.RawMessage, err error) {
				if err != nil || !strings.Contains(string(out), `"ok": 1`) {
					t.Fatalf("Infer = %s, %v", out, err)
				}
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			timeout := tc.timeout
			if timeout == 0 {
				timeout = testDeadline
			}
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			out, err := p.Infer(ctx, backend.Request{Inputs: json.RawMessage(tc.inputs)})
			tc.check(t, out, err)
		})
	}
}

func TestInferReturnsErrExitedWhenModelCrashesMidCall(t *testing.T) {
	p := startReady(t, testBackend(t), echoSpec(t, "crash-1"))
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()

	_, err := p.Infer(ctx, backend.Request{Inputs: json.RawMessage(`{"crash": true}`)})
	if !errors.Is(err, backend.ErrExited) || !strings.Contains(err.Error(), "exit status 3") {
		t.Fatalf("err = %v, want ErrExited with exit status 3", err)
	}
	if !closed(p.Exited()) {
		t.Fatal("ErrExited returned before Exited closed")
	}
	if got := p.ExitErr(); got == nil || got.Error() != "exit status 3" {
		t.Errorf("ExitErr = %v, want exit status 3", got)
	}
	if got := p.LastLogLine(); got != "crashing on request" {
		t.Errorf("LastLogLine = %q", got)
	}
}

func TestBootFailures(t *testing.T) {
	tests := []struct {
		name      string
		env       map[string]string
		wantExit  string
		wantLine  string
		stopAfter bool // the model stays up unready; Stop must end it
	}{
		{
			name:     "boot fails",
			env:      map[string]string{"BOOT_FAIL": "1"},
			wantExit: "exit status 1",
			wantLine: "boot failed: BOOT_FAIL is set",
		},
		{
			name:      "never ready",
			env:       map[string]string{"NEVER_READY": "1"},
			stopAfter: true,
		},
		{
			name:      "stopped while booting",
			env:       map[string]string{"BOOT_DELAY": "60"},
			stopAfter: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBackend(t)
			spec := echoSpec(t, "boot-1")
			spec.Model.Env = tc.env
			p := startModel(t, b, spec)
			if tc.stopAfter {
				if tc.env["NEVER_READY"] != "" {
					waitHealth(t, p, http.StatusServiceUnavailable)
				}
				start := time.Now()
				p.stop(10 * time.Second)
				if d := time.Since(start); d > 5*time.Second {
					t.Errorf("Stop took %v: SIGTERM was not honoured", d)
				}
			}
			waitExited(t, p)
			if closed(p.Ready()) {
				t.Error("Ready closed for a model that never answered 2xx")
			}
			if got := fmt.Sprint(p.ExitErr()); tc.wantExit != "" && got != tc.wantExit {
				t.Errorf("ExitErr = %s, want %s", got, tc.wantExit)
			}
			if got := p.LastLogLine(); tc.wantLine != "" && got != tc.wantLine {
				t.Errorf("LastLogLine = %q, want %q", got, tc.wantLine)
			}
			if _, err := os.Stat(pidFilePath(b.cfg.RunDir, spec.ReplicaID)); !os.IsNotExist(err) {
				t.Errorf("pid file left after exit: %v", err)
			}
		})
	}
}

// waitHealth polls the model's health check from outside until it answers status,
// which shows the model is up.
func waitHealth(t *testing.T, p *Process, status int) {
	t.Helper()
	client := modelClient(p)
	url := modelURL(p, "/healthz")
	waitFor(t, fmt.Sprintf("health check to answer %d", status), func() bool {
		resp, err := client.Get(url)
		if err != nil {
			return false
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp.StatusCode == status
	})
}

func TestLeakedChildrenDieWithTheReplica(t *testing.T) {
	tests := []struct {
		name string
		end  func(t *testing.T, p *Process)
	}{
		{"stopped", func(t *testing.T, p *Process) { p.stop(5 * time.Second) }},
		{"crashed", func(t *testing.T, p *Process) {
			p.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{"crash": true}`)})
			waitExited(t, p)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := startReady(t, testBackend(t), echoSpec(t, "spawn-1"))
			child := hostPid(t, p, infer(t, p, `{"spawn": true}`).Child)
			if child <= 0 || processGone(child) {
				t.Fatalf("spawned child %d not running", child)
			}
			tc.end(t, p)
			waitGone(t, child)
		})
	}
}

func TestStopEscalatesToKillAndIsIdempotent(t *testing.T) {
	// The ignored SIGTERM is inherited by sleep, so only SIGKILL ends the group.
	p := startModel(t, testBackend(t), shSpec("stubborn-1", `trap "" TERM; echo trapped; while :; do sleep 1; done`))
	waitFor(t, "the trap to be set", func() bool { return p.LastLogLine() == "trapped" })

	const grace = 300 * time.Millisecond
	start := time.Now()
	var wg sync.WaitGroup
	for range 3 {
		wg.Go(func() {
			p.stop(grace)
			if !closed(p.Exited()) {
				t.Error("Stop returned before Exited")
			}
		})
	}
	wg.Wait()
	if d := time.Since(start); d < grace {
		t.Errorf("Stop returned after %v, before the grace of %v", d, grace)
	}
	if got := fmt.Sprint(p.ExitErr()); got != "signal: killed" {
		t.Errorf("ExitErr = %s, want signal: killed", got)
	}
	p.stop(grace) // after exit: returns at once
}

func TestLogFileRotatesAtCap(t *testing.T) {
	// About 300 KB in all, far more than the cap plus one pipe read, even when the
	// copier falls behind and reads 32 KiB at a time.
	pad := strings.Repeat("x", 90)
	b := testBackend(t)
	b.cfg.LogMaxBytes = 4096
	spec := shSpec("chatty-1", `i=0; while [ $i -lt 3000 ]; do echo "line $i `+pad+`"; i=$((i+1)); done`)
	p := startModel(t, b, spec)
	waitExited(t, p)

	if err := p.ExitErr(); err != nil {
		t.Fatalf("ExitErr = %v", err)
	}
	if got := p.LastLogLine(); got != "line 2999 "+pad {
		t.Errorf("LastLogLine = %q", got)
	}
	cur, err := os.ReadFile(b.logPath(spec))
	if err != nil {
		t.Fatal(err)
	}
	old, err := os.ReadFile(b.logPath(spec) + ".1")
	if err != nil {
		t.Fatalf("no rotated log: %v", err)
	}
	// A rotation happens after the write that crosses the cap, and one write is at
	// most one pipe read (32 KiB).
	const slack = 32 << 10
	if len(old) <= 4096 || len(old) > 4096+slack || len(cur) > 4096+slack {
		t.Errorf("sizes: log %d, log.1 %d; cap 4096", len(cur), len(old))
	}
	if !strings.HasSuffix(string(cur), "line 2999 "+pad+"\n") && len(cur) > 0 {
		t.Errorf("current log does not end with the last line: %q", cur[max(0, len(cur)-40):])
	}
	if strings.Contains(string(old)+string(cur), "line 0 ") {
		t.Error("the oldest lines should have been rotated away")
	}
}

// escapeScript starts a child in a session of its own (setsid), out of the
// replica's process group, that reports its pid once it is there.
const escapeScript = `setsid sh -c 'echo "escaped $$"; exec sleep 1000' & wait`

// Without a cgroup (replica.cgroups: false, or no privilege to make one) a child
// that left the process group survives the replica: at least it must not hold up
// its end.
func TestExitedDoesNotWaitForAChildThatLeftTheGroup(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid (util-linux): %v", err)
	}
	// The escaped sleep keeps the log pipe open after the leader exits; Exited must
	// still close (after drainWait) and the copier must end. It reports its pid only
	// once it has its own session, so Stop cannot reach it.
	b := testBackendWith(t, func(c *Config) { c.NoCgroups = true })
	noNamespaces(b) // in a PID namespace of its own, the escaped child would die with the replica
	p := startModel(t, b, shSpec("escape-1", escapeScript))
	waitFor(t, "the child to start", func() bool { return strings.HasPrefix(p.LastLogLine(), "escaped ") })
	escaped, _ := strconv.Atoi(strings.TrimPrefix(p.LastLogLine(), "escaped "))
	t.Cleanup(func() { syscall.Kill(escaped, syscall.SIGKILL) })

	p.stop(time.Second)
	if processGone(escaped) {
		t.Fatal("the escaped child died: this test no longer covers a held pipe")
	}
	if got := fmt.Sprint(p.ExitErr()); got != "signal: terminated" {
		t.Errorf("ExitErr = %s, want signal: terminated", got)
	}
}

// A model is checked again as soon as it writes output, so one that prints a line
// once it listens is found ready without waiting for the next poll. With the poll
// interval set to an hour, the line is the only thing that can make it ready.
func TestOutputTriggersReadinessCheck(t *testing.T) {
	b := testBackend(t)
	b.readyIntervals = []time.Duration{time.Hour}

	spec := echoSpec(t, "hint-1")
	// Not listening at the first check, which comes right after the fork.
	spec.Model.Env = map[string]string{"BOOT_DELAY": "0.2"}
	p := startReady(t, b, spec)
	if got := p.LastLogLine(); !strings.Contains(got, "listening") {
		t.Errorf("LastLogLine = %q, want the model's listening line", got)
	}
}

// In its cgroup nothing a replica started outlives it: a stop, or the leader's own
// exit, kills the child that left the process group too.
func TestAChildThatLeftTheGroupDiesWithTheReplicaInItsCgroup(t *testing.T) {
	if _, err := exec.LookPath("setsid"); err != nil {
		testenv.Missing(t, "setsid (util-linux): %v", err)
	}
	b := testBackend(t)
	if b.sb.cgroups == nil {
		testenv.Missing(t, "a cgroup per replica (%s): run as root", b.sb.cgWhy)
	}
	// The cgroup's own kill, as on a host that allows no namespaces: in a
	// PID namespace the child would die with the replica's init anyway.
	noNamespaces(b)
	for _, tc := range []struct {
		name   string
		script string
		end    func(p *Process)
	}{
		{"stopped", escapeScript, func(p *Process) { p.stop(time.Second) }},
		{"leader exits", `setsid sh -c 'echo $$ > "$HOME/child"; exec sleep 1000' &
			until [ -s "$HOME/child" ]; do :; done; echo "escaped $(cat "$HOME/child")"
			until [ -e "$HOME/exit" ]; do sleep 0.01; done; exit 3`, func(p *Process) {
			if err := os.WriteFile(filepath.Join(p.box.dir, "exit"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			waitExited(t, p)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := startModel(t, b, shSpec("escape-2", tc.script))
			waitFor(t, "the child to start", func() bool { return strings.HasPrefix(p.LastLogLine(), "escaped ") })
			escaped, _ := strconv.Atoi(strings.TrimPrefix(p.LastLogLine(), "escaped "))
			escaped = hostPid(t, p, escaped)
			t.Cleanup(func() { syscall.Kill(escaped, syscall.SIGKILL) })
			tc.end(p)
			if !processGone(escaped) {
				t.Fatalf("the child %d that left the group is alive after the replica ended", escaped)
			}
		})
	}
}
