// Package replicainit is the replica's init: what a replica's process runs
// first. The local backend starts inferd's own binary again (/proc/self/exe)
// under the name Arg0, from the thread that entered the replica's box; this
// package's init function sees the name and runs the init instead of the
// program, which then starts the model. It is a package of its own, that
// imports only the standard library and x/sys/unix, so that Go initialises
// it, and the init takes over, before the packages inferd links in and the
// init never needs (etcd's and the metrics' set-up cost a replica's boot
// about 15 ms). Nothing else of inferd runs in it, and it reads nothing from
// its environment (which the backend leaves empty: a project's LD_PRELOAD
// must never reach a process that may still be root); what it must do comes
// from the daemon over a pipe (fd 3), and how it went goes back over
// another (fd 4).
//
// Where the box has them (the local backend's pidNamespace and privateTmp
// protections), the init starts in a PID namespace and a mount namespace of
// its own, as the namespace's process 1, and before the model runs it
//   - mounts a fresh /proc, which shows the replica's own processes only;
//   - mounts a tmpfs of the replica's own on /tmp, /var/tmp and /dev/shm,
//     each at most memoryMiB, whose pages the memory cgroup charges to the
//     replica, and which vanish with its mount namespace; the model's dir,
//     its program's dir and its private HOME are bound back in where they
//     sat under one of them;
//
// then it starts the model as its child and stays: it reaps whatever the
// model leaves to it, passes on the signals the model's process group did
// not get, and when the model exits, exits with its status. The kernel then
// kills everything left in the namespace. Its parent-death signal is the
// daemon's forking thread's: when the daemon dies, even by kill -9, the
// init dies, and with it the namespace, setsid children included.
//
// Without namespaces (not root, no CAP_SYS_ADMIN) the init only sets up
// what a process may do to itself and then execs the model in its place.
//
// Either way it drops the capabilities an exec would hand on (the packaged
// service's ambient ones, which the init itself needed for its mounts),
// switches to the model's user, and installs the seccomp filter against
// user namespaces (seccomp.go) unless the project allows them.
package replicainit

import (
	"encoding/gob"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// Arg0 is the name the replica's init is started under.
const Arg0 = "inferd-replica-init"

// Its two pipes, as the daemon passes them (ExtraFiles).
const (
	ConfigFD = 3
	StatusFD = 4
)

func init() {
	if len(os.Args) > 0 && os.Args[0] == Arg0 {
		// Every package this one imports has been initialised, and
		// maybe a few light others; the program inferd (or a test
		// binary) was is not started. The main goroutine stays on the
		// main thread, which
		// everything below changes (capabilities, the seccomp filter) and
		// which forks or becomes the model.
		runtime.LockOSThread()
		os.Exit(run())
	}
}

// Config is what the daemon tells the init, in gob: arguments and
// environment are bytes, which JSON would turn into valid UTF-8.
type Config struct {
	Path string   // the model's program, as exec.LookPath found it
	Args []string // its argv
	Env  []string
	Dir  string
	// Credential is the model's user; nil = the init's own.
	Credential *syscall.Credential
	// Namespaces: the init is process 1 of a PID and a mount namespace of
	// its own: it mounts /proc and the private tmp dirs and starts the
	// model as its child.
	Namespaces bool
	// TmpBytes is the size of each private tmpfs; 0 = the kernel's
	// default (half the memory).
	TmpBytes int64
	// Keep are host paths the model needs (its dir, its program's dir,
	// its HOME): one that sat under a private tmp dir, or a Hide dir, is
	// bound back in.
	Keep []string
	// Hide are host dirs the model may not look into (the data dir): each
	// is covered by an empty tmpfs of its own (mode 0755), Keep paths under
	// it bound back in.
	Hide []string
	// UserNamespaces: install no filter against them.
	UserNamespaces bool
	// Parent is the daemon's pid: without namespaces, after switching
	// users, the init arms the parent-death signal again (a change of
	// user clears it) and gives up if the daemon is already gone.
	Parent int
	// Image, when set, is the root the model runs in (imageroot.go),
	// which needs Namespaces; Path may then be a bare name, found on the
	// PATH in Env inside the image.
	Image *ImageRoot
	// Probe: set everything up, start nothing, report and exit (New asks
	// once what this machine allows).
	Probe bool
}

// Status is one line the init sends back.
type Status struct {
	Started bool   `json:"started,omitempty"` // the model runs (namespaces; else the pipe closes on exec)
	Error   string `json:"error,omitempty"`   // it could not be started; the init exits
	Errno   int    `json:"errno,omitempty"`   // the system error behind Error, if any
	Exit    *int   `json:"exit,omitempty"`    // the model exited with this status
	Signal  int    `json:"signal,omitempty"`  // the model was killed by this signal
}

// TmpDirs get a tmpfs of the replica's own.
var TmpDirs = []string{"/tmp", "/var/tmp", "/dev/shm"}

// replicaInit runs the init and returns its exit status.
func run() int {
	status := os.NewFile(StatusFD, "status")
	send := func(s Status) {
		line, _ := json.Marshal(s)
		status.Write(append(line, '\n'))
	}
	fail := func(err error) int {
		s := Status{Error: err.Error()}
		var errno syscall.Errno
		if errors.As(err, &errno) {
			s.Errno = int(errno)
		}
		send(s)
		return 127
	}
	// Neither pipe may reach the model.
	unix.CloseOnExec(StatusFD)
	cfgFile := os.NewFile(ConfigFD, "config")
	var cfg Config
	err := gob.NewDecoder(cfgFile).Decode(&cfg)
	cfgFile.Close()
	if err != nil {
		return fail(fmt.Errorf("replica init: read its configuration: %w", err))
	}
	switch {
	case cfg.Image != nil && !cfg.Namespaces:
		return fail(errors.New("replica init: an image needs a mount namespace"))
	case cfg.Image != nil:
		if err := mountImage(cfg); err != nil {
			return fail(err)
		}
		if cfg.Path, err = lookPath(cfg.Path, cfg.Env); err != nil {
			return fail(err)
		}
	case cfg.Namespaces:
		if err := mountPrivate(cfg); err != nil {
			return fail(err)
		}
	}
	if err := dropCapabilities(); err != nil {
		return fail(err)
	}
	if !cfg.UserNamespaces {
		if err := denyUserNamespaces(); err != nil {
			return fail(err)
		}
	}
	if cfg.Probe {
		send(Status{Started: true})
		return 0
	}
	if !cfg.Namespaces {
		return fail(execModel(cfg))
	}
	return superviseModel(cfg, send, fail)
}

// mountPrivate gives the mount namespace its own /proc and tmp dirs.
func mountPrivate(cfg Config) error {
	// Nothing mounted here reaches the host; what the host mounts later
	// still shows here.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_SLAVE, ""); err != nil {
		return fmt.Errorf("replica init: make its mounts its own: %w", err)
	}
	// Hold on to what must stay visible before the tmpfs hide it.
	var keep []kept
	defer func() {
		for _, k := range keep {
			unix.Close(k.fd)
		}
	}()
	var mounted, hidden []string
	for _, dir := range TmpDirs {
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() {
			continue // absent, or a link to another (mounting would follow it)
		}
		mounted = append(mounted, dir)
	}
	for _, dir := range cfg.Hide {
		if fi, err := os.Lstat(dir); err != nil || !fi.IsDir() || dir == "/" {
			continue
		}
		hidden = append(hidden, dir)
	}
	mounted = append(mounted, hidden...)
	for _, p := range cfg.Keep {
		if !under(p, mounted) {
			continue
		}
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("replica init: open %s: %w", p, err)
		}
		keep = append(keep, kept{p, fd})
	}
	// The hidden dirs first: one under a tmp dir then goes with it.
	for _, dir := range hidden {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=1048576"); err != nil {
			return fmt.Errorf("replica init: hide %s: %w", dir, err)
		}
	}
	opts := "mode=1777"
	if cfg.TmpBytes > 0 {
		opts += ",size=" + strconv.FormatInt(cfg.TmpBytes, 10)
	}
	for _, dir := range mounted[:len(mounted)-len(hidden)] {
		if err := unix.Mount("tmpfs", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("replica init: mount a private tmpfs on %s: %w", dir, err)
		}
	}
	for _, k := range keep {
		if err := bindBack(k.path, k.fd); err != nil {
			return err
		}
	}
	// The host's /proc goes, lest a model with the rights to unmount the
	// new one find it underneath.
	if err := unix.Unmount("/proc", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("replica init: unmount the host's /proc: %w", err)
	}
	if err := unix.Mount("proc", "/proc", "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("replica init: mount its own /proc: %w", err)
	}
	return nil
}

// under reports whether path is inside one of dirs (not one of them).
func under(path string, dirs []string) bool {
	for _, d := range dirs {
		if strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// bindBack makes the host's path (held open as fd) show at path again.
func bindBack(path string, fd int) error {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return fmt.Errorf("replica init: stat %s: %w", path, err)
	}
	parent := path
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		parent = filepath.Dir(path)
	}
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("replica init: %w", err)
	}
	if parent != path {
		f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("replica init: %w", err)
		}
		f.Close()
	}
	// The mount source is the open file, whatever the path shows now.
	src := "/proc/self/fd/" + strconv.Itoa(fd)
	if err := unix.Mount(src, path, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("replica init: bind %s back in: %w", path, err)
	}
	return nil
}

// dropCapabilities empties the calling thread's ambient and inheritable
// capabilities, which an exec would hand to the model, and sets
// no_new_privs: no setuid program or file capability gives the model any,
// and an unprivileged init may install the seccomp filter.
func dropCapabilities() error {
	if err := unix.Prctl(unix.PR_CAP_AMBIENT, unix.PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0); err != nil && !errors.Is(err, unix.EINVAL) {
		return fmt.Errorf("replica init: drop ambient capabilities: %w", err)
	}
	if err := clearInheritable(); err != nil {
		return fmt.Errorf("replica init: %w", err)
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("replica init: set no_new_privs: %w", err)
	}
	return nil
}

// execModel becomes the model (no namespaces): it switches users, arms the
// parent-death signal again and execs. It returns only on failure.
func execModel(cfg Config) error {
	if c := cfg.Credential; c != nil {
		groups := make([]int, len(c.Groups))
		for i, g := range c.Groups {
			groups[i] = int(g)
		}
		if err := syscall.Setgroups(groups); err != nil {
			return fmt.Errorf("replica init: setgroups: %w", err)
		}
		if err := syscall.Setresgid(int(c.Gid), int(c.Gid), int(c.Gid)); err != nil {
			return fmt.Errorf("replica init: setgid %d: %w", c.Gid, err)
		}
		if err := syscall.Setresuid(int(c.Uid), int(c.Uid), int(c.Uid)); err != nil {
			return fmt.Errorf("replica init: setuid %d: %w", c.Uid, err)
		}
	}
	if err := unix.Prctl(unix.PR_SET_PDEATHSIG, uintptr(unix.SIGKILL), 0, 0, 0); err != nil {
		return fmt.Errorf("replica init: parent-death signal: %w", err)
	}
	if os.Getppid() != cfg.Parent {
		return errors.New("replica init: the daemon is gone")
	}
	if cfg.Dir != "" {
		if err := os.Chdir(cfg.Dir); err != nil {
			return fmt.Errorf("chdir %s: %w", cfg.Dir, errBrief(err))
		}
	}
	err := syscall.Exec(cfg.Path, cfg.Args, cfg.Env)
	return &os.PathError{Op: "fork/exec", Path: cfg.Path, Err: err}
}

// superviseModel starts the model as the namespace's process 1's child and
// stays with it until it exits, then exits with its status.
func superviseModel(cfg Config, send func(Status), fail func(error) int) int {
	// Before the model exists, so that no signal meant for it is lost:
	// Go's default for SIGTERM would end the init, and with it the model
	// at once, with no grace.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	pid, err := syscall.ForkExec(cfg.Path, cfg.Args, &syscall.ProcAttr{
		Dir:   cfg.Dir,
		Env:   cfg.Env,
		Files: []uintptr{0, 1, 2},
		Sys:   &syscall.SysProcAttr{Credential: cfg.Credential},
	})
	if err != nil {
		if cfg.Dir != "" {
			if _, serr := os.Stat(cfg.Dir); serr != nil {
				return fail(fmt.Errorf("chdir %s: %w", cfg.Dir, errBrief(serr)))
			}
		}
		return fail(&os.PathError{Op: "fork/exec", Path: cfg.Path, Err: err})
	}
	send(Status{Started: true})
	go forwardSignals(sigs, pid)
	for {
		var ws syscall.WaitStatus
		got, err := syscall.Wait4(-1, &ws, 0, nil)
		if err != nil {
			if errors.Is(err, syscall.EINTR) {
				continue
			}
			return fail(fmt.Errorf("replica init: wait: %w", err))
		}
		if got != pid {
			continue // an orphan the model left: reaped, nothing more
		}
		if ws.Signaled() {
			send(Status{Signal: int(ws.Signal())})
			return 128 + int(ws.Signal())
		}
		code := ws.ExitStatus()
		send(Status{Exit: &code})
		return code
	}
}

// forwardSignals hands the model the signals the init gets: the daemon
// signals the process group, which the model is in unless it left it
// (setsid), and then only the init gets them.
func forwardSignals(sigs <-chan os.Signal, model int) {
	for sig := range sigs {
		if pgid, err := syscall.Getpgid(model); err == nil && pgid == syscall.Getpgrp() {
			continue // it got this one itself
		}
		syscall.Kill(model, sig.(syscall.Signal))
	}
}

// clearInheritable empties the calling thread's inheritable capabilities,
// which an exec keeps (a program with file capabilities could take them up
// again); its effective and permitted ones, inferd's own, stay.
func clearInheritable() error {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return fmt.Errorf("read capabilities: %w", err)
	}
	if data[0].Inheritable == 0 && data[1].Inheritable == 0 {
		return nil
	}
	data[0].Inheritable, data[1].Inheritable = 0, 0
	if err := unix.Capset(&hdr, &data[0]); err != nil {
		return fmt.Errorf("drop inheritable capabilities: %w", err)
	}
	return nil
}

// errBrief is an error without the path the caller already names.
func errBrief(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}
