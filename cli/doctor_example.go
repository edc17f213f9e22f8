package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"inferd/config"
	"inferd/scheduler/replica"
)

// exampleBootTimeout bounds how long doctor waits for the example model.
const exampleBootTimeout = 15 * time.Second

// exampleDirs are where the echo example lives: beside the installed binary
// (/usr/bin/inferd → /usr/share/inferd/examples/echo, as packaged) or in a
// source checkout.
func exampleDirs() []string {
	var dirs []string
	if exe, err := os.Executable(); err == nil {
		dirs = append(dirs, filepath.Join(filepath.Dir(exe), "..", "share", "inferd", "examples", "echo"))
	}
	return append(dirs, filepath.Join("examples", "echo"))
}

// doctorModelUser reports who model processes will run as, the way serve
// decides it, and returns that user (nil: doctor's own user).
func doctorModelUser(r *doctorReport, cfg config.Config) (runAs *replica.RunAs, ok bool) {
	runAs, err := modelUser(cfg.Replica.User, zerolog.Nop())
	switch {
	case err != nil:
		r.line("fail", "model user", "%v: serve will refuse to start; create the user or set replica.user", err)
		return nil, false
	case runAs != nil:
		r.line("ok", "model user", "models run as %s (uid %d), since inferd runs as root (replica.user)", runAs.Name, runAs.UID)
	case os.Geteuid() == 0:
		r.line("warn", "model user", "models run as root (replica.user: root): a model can read the data file and the keys")
	default:
		r.line("ok", "model user", "models run as inferd's own user")
	}
	return runAs, true
}

// doctorExample checks python3 and that the example model boots: it runs
// examples/echo the way a replica runs (its own port, on loopback, as the
// model user), waits for GET /healthz, and stops it. That proves that model
// servers can run here.
func doctorExample(r *doctorReport, runAs *replica.RunAs) {
	py, err := exec.LookPath("python3")
	if err != nil {
		r.line("warn", "python3", "not on PATH: the example model (examples/echo) needs it; install python3")
		return
	}
	r.line("ok", "python3", "%s", py)
	dir := ""
	for _, d := range exampleDirs() {
		if _, err := os.Stat(filepath.Join(d, "server.py")); err == nil {
			dir = filepath.Clean(d)
			break
		}
	}
	if dir == "" {
		r.line("warn", "example", "the echo example is not installed (looked in %s): skipped the model boot check", strings.Join(exampleDirs(), ", "))
		return
	}
	took, err := bootExample(py, dir, runAs)
	if err != nil {
		who := "this user"
		if runAs != nil {
			who = "user " + runAs.Name
		}
		r.line("fail", "example", "%s did not boot: %v; model servers will fail the same way: check that %s can run %s and read %s", dir, err, who, py, dir)
		return
	}
	r.line("ok", "example", "%s boots and answers /healthz (%s)", dir, took.Round(time.Millisecond))
}

// bootExample starts the echo server in dir, waits until /healthz answers 200,
// and stops it; the process never outlives the call.
func bootExample(python, dir string, runAs *replica.RunAs) (time.Duration, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()

	ctx, cancel := context.WithTimeout(context.Background(), exampleBootTimeout)
	defer cancel()
	start := time.Now()
	cmd := exec.CommandContext(ctx, python, "server.py")
	cmd.Dir = dir
	cmd.Env = []string{"PORT=" + strconv.Itoa(port), "PATH=" + os.Getenv("PATH"), "PYTHONDONTWRITEBYTECODE=1"}
	if runAs != nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: runAs.Credential()}
		cmd.Env = append(cmd.Env, "HOME="+runAs.Home)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	defer func() {
		cancel() // kills the server if it still runs
		<-exited
	}()

	url := fmt.Sprintf("http://127.0.0.1:%d/healthz", port)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return time.Since(start), nil
			}
		}
		select {
		case err := <-exited:
			exited <- err // for the deferred wait
			return 0, fmt.Errorf("exited (%v): %s", err, lastLine(stderr.String()))
		case <-ctx.Done():
			exited <- <-exited // ctx killed it; stderr is complete once it is reaped
			return 0, fmt.Errorf("no answer on /healthz within %s: %s", exampleBootTimeout, lastLine(stderr.String()))
		case <-tick.C:
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return "no output"
	}
	return s
}
