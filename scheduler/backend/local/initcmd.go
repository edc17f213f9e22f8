package local

import (
	"bufio"
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"

	"inferd/scheduler/backend/local/replicainit"
)

// The daemon's side of a replica's init (replicainit.go): the command that
// starts it, the configuration handed over once it runs, and what it says
// back: whether the model started, then how it ended.

// initTasks is what the init may hold of a replica's pidsMax beyond the
// project's own figure, when it stays as the namespace's process 1: its Go
// runtime's threads count as tasks (GOMAXPROCS=1 keeps them few).
const initTasks = 8

// initProcess is one replica's init, seen from the daemon.
type initProcess struct {
	cfg     replicainit.Config
	cfgW    *os.File // the daemon's end of the configuration pipe
	statusR *os.File // the daemon's end of the status pipe
	status  *bufio.Reader
	// childEnds are the init's ends of both pipes, closed once it runs.
	childEnds []*os.File
}

// initCommand returns the command that starts an init with cfg, in a PID
// and a mount namespace of its own when cfg.Namespaces. The caller adds
// what else the process needs (its output, process group, cgroup), starts
// it from the thread that entered the box, and calls handOver.
func initCommand(cfg replicainit.Config, replicaID string) (*exec.Cmd, *initProcess, error) {
	cfgR, cfgW, err := os.Pipe()
	if err != nil {
		return nil, nil, fmt.Errorf("replica init pipe: %w", err)
	}
	statusR, statusW, err := os.Pipe()
	if err != nil {
		cfgR.Close()
		cfgW.Close()
		return nil, nil, fmt.Errorf("replica init pipe: %w", err)
	}
	ip := &initProcess{cfg: cfg, cfgW: cfgW, statusR: statusR, status: bufio.NewReader(statusR), childEnds: []*os.File{cfgR, statusW}}
	cmd := exec.Command("/proc/self/exe", replicaID)
	cmd.Args[0] = replicainit.Arg0
	// Nothing of the daemon's environment or the project's: the init may
	// run as root, and the model's environment travels in cfg.
	// GORACE: a binary built with -race (the e2e tests') sleeps a second
	// before it exits by default, which every replica's stop would wait for.
	cmd.Env = []string{"GOMAXPROCS=1", "GORACE=atexit_sleep_ms=0"}
	cmd.ExtraFiles = []*os.File{cfgR, statusW} // fds 3 and 4 (replicainit.ConfigFD, replicainit.StatusFD)
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if cfg.Namespaces {
		cmd.SysProcAttr.Cloneflags = syscall.CLONE_NEWPID | syscall.CLONE_NEWNS
	}
	return cmd, ip, nil
}

// handOver sends the init its configuration and waits for its first word:
// nil once the model runs, or why it could not be started (the init has
// exited or is exiting: the caller waits for it). Call it once the init
// has started.
func (ip *initProcess) handOver() error {
	for _, f := range ip.childEnds {
		f.Close()
	}
	ip.childEnds = nil
	// The init reads it whole before anything else; a write fails only
	// when the init died first, which the status pipe then says.
	gob.NewEncoder(ip.cfgW).Encode(ip.cfg)
	ip.cfgW.Close()
	st, err := ip.next()
	switch {
	case errors.Is(err, io.EOF):
		if ip.cfg.Namespaces {
			return errors.New("replica init: exited before starting the model")
		}
		return nil // the pipe closed on exec: the model runs
	case err != nil:
		return err
	case st.Error != "":
		return startError(st)
	}
	return nil
}

// next reads one status line.
func (ip *initProcess) next() (replicainit.Status, error) {
	var st replicainit.Status
	line, err := ip.status.ReadBytes('\n')
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(line, &st); err != nil {
		return st, fmt.Errorf("replica init: unreadable status %q: %w", line, err)
	}
	return st, nil
}

// exitErr is how the model ended, once the init has been waited for:
// waitErr (the init's own end, as exec.Cmd.Wait reports it) unless the
// init reported the model's, as exec would have: "exit status 3",
// "signal: killed", or nil for a clean exit.
func (ip *initProcess) exitErr(waitErr error) error {
	for {
		st, err := ip.next()
		if err != nil {
			return waitErr
		}
		switch {
		case st.Signal != 0:
			return &modelExit{fmt.Sprintf("signal: %v", syscall.Signal(st.Signal))}
		case st.Exit != nil && *st.Exit == 0:
			return nil
		case st.Exit != nil:
			return &modelExit{fmt.Sprintf("exit status %d", *st.Exit)}
		}
	}
}

// close releases the daemon's ends of the pipes.
func (ip *initProcess) close() {
	for _, f := range append(ip.childEnds, ip.cfgW, ip.statusR) {
		f.Close()
	}
}

// modelExit is a model's exit status reported by its init, worded as
// exec.ExitError words it.
type modelExit struct{ s string }

func (e *modelExit) Error() string { return e.s }

// startError is the start failure the init reported, wrapping its system
// error (so that errors.Is(err, os.ErrPermission) holds for EACCES).
func startError(st replicainit.Status) error {
	if st.Errno != 0 {
		return &initError{msg: st.Error, errno: syscall.Errno(st.Errno)}
	}
	return errors.New(st.Error)
}

type initError struct {
	msg   string
	errno syscall.Errno
}

func (e *initError) Error() string { return e.msg }
func (e *initError) Unwrap() error { return e.errno }

// keepPaths are the host paths a model must still find in a mount
// namespace whose tmp dirs are its own: its dir, its program's dir, the
// files and dirs its arguments name by absolute path (python3
// /tmp/model/server.py) and its private HOME.
func keepPaths(dir, program string, args []string, home string) []string {
	var keep []string
	add := func(p string) { keep = append(keep, filepath.Clean(p)) }
	if dir != "" {
		add(dir)
	}
	if filepath.IsAbs(program) { // a relative one is found from dir
		add(filepath.Dir(program))
	}
	for _, a := range args {
		if !filepath.IsAbs(a) {
			continue
		}
		fi, err := os.Stat(a)
		switch {
		case err != nil:
			continue // not a path here: an option's value, a URL path
		case fi.IsDir():
			add(a)
		default:
			add(filepath.Dir(a))
		}
	}
	if home != "" {
		add(home)
	}
	return keep
}

// What this machine lets the init do, found once per process by starting
// one (probeInit): namespaces need root or CAP_SYS_ADMIN (and no systemd
// RestrictNamespaces= or seccomp policy forbidding them), the filter a
// kernel with seccomp filters.
var (
	probeNamespaces = sync.OnceValue(func() error {
		return probeInit(replicainit.Config{Probe: true, Namespaces: true, UserNamespaces: true})
	})
	probeFilter = sync.OnceValue(func() error { return probeInit(replicainit.Config{Probe: true}) })
)

// probeInit starts an init that sets up what cfg asks and starts nothing,
// and returns why it failed.
func probeInit(cfg replicainit.Config) error {
	done := make(chan error, 1)
	go func() {
		// Locked for Pdeathsig's sake, as a replica's forking thread is.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		done <- runProbe(cfg)
	}()
	return <-done
}

func runProbe(cfg replicainit.Config) error {
	cfg.Parent = os.Getpid()
	cmd, ip, err := initCommand(cfg, "probe")
	if err != nil {
		return err
	}
	defer ip.close()
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		return errBrief(err)
	}
	err = ip.handOver()
	if werr := cmd.Wait(); err == nil && werr != nil {
		err = fmt.Errorf("replica init: %w", werr)
	}
	return err
}
