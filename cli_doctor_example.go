package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"inferd/config"
	"inferd/scheduler/backend"
	"inferd/scheduler/backend/local"
	"inferd/store"
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
func doctorModelUser(r *doctorReport, cfg config.Config) (runAs *local.RunAs, ok bool) {
	runAs, err := local.ModelUser(cfg.Replica.User)
	switch {
	case err != nil:
		r.line("fail", "model user", "config: replica.user: %v: serve will refuse to start; create the user or set replica.user", err)
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
// examples/echo the way a replica runs (through the local-process backend:
// its own port, on loopback, as the model user), waits for GET /healthz, and
// stops it. That proves that model servers can run here.
func doctorExample(r *doctorReport, runAs *local.RunAs) {
	py, err := local.LookPath("python3")
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

// bootExample starts the echo server in dir as a replica of a backend of its
// own (no logs or pid files kept), waits until /healthz answers, and stops
// it; the process never outlives the call.
func bootExample(python, dir string, runAs *local.RunAs) (time.Duration, error) {
	user := "root" // with runAs nil: doctor's own user, root or not
	if runAs != nil {
		user = runAs.Name
	}
	b, err := local.New(local.Config{User: user, StopGrace: time.Second}, zerolog.Nop())
	if err != nil {
		return 0, err
	}
	start := time.Now()
	inst, err := b.Launch(backend.Spec{
		ReplicaID: "doctor-example",
		Model: store.ModelSpec{
			Command: []string{python, "server.py"},
			Dir:     dir,
			Env:     map[string]string{"PYTHONDONTWRITEBYTECODE": "1"},
		},
	})
	if err != nil {
		return 0, err
	}
	defer inst.Stop()
	t := time.NewTimer(exampleBootTimeout)
	defer t.Stop()
	select {
	case <-inst.Ready():
		return time.Since(start), nil
	case <-inst.Exited():
		return 0, fmt.Errorf("exited (%v): %s", inst.ExitErr(), lastLine(inst.LastLogLine()))
	case <-t.C:
		return 0, fmt.Errorf("no answer on /healthz within %s: %s", exampleBootTimeout, lastLine(inst.LastLogLine()))
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
