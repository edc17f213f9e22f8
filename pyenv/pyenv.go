// Package pyenv builds the Python virtual environments projects run in (a
// project's python: field; docs/python.md). One environment serves every
// project that asks for the same one: it is named by a digest of what
// makes it (the interpreter, the requirements file's bytes, the wheels of
// the wheelhouse and the package index), built once, and kept. From a
// wheelhouse it is built offline (pip --no-index --find-links); without
// one, from the configured package index.
//
// An environment is built in place, at its final path (a venv's scripts
// name their interpreter by absolute path), and marked ready last: one
// without the mark is a build that failed or was cut short, removed before
// the next try. A lock file per environment keeps two builders (two
// replicas booting, two processes) from building it at once.
package pyenv

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultInterpreter is the Python an environment is made from when the
// project names none: Debian's, which has venv and ensurepip and which
// any uid may run (a pyenv under /root would not do).
const DefaultInterpreter = "/usr/bin/python3"

// BuildTimeout bounds one build: a build that hangs (a package's build
// code waiting on the network forever) must not leave a replica booting
// for good, since bootTimeout does not count the build.
const BuildTimeout = time.Hour

// readyMark is written into an environment once it is whole.
const readyMark = ".inferd-ready"

// Spec is what an environment is made from (store.PythonSpec).
type Spec struct {
	Requirements string // absolute path of a requirements file
	Wheelhouse   string // absolute path of a directory of wheels; "" = the package index
	Interpreter  string // "" = DefaultInterpreter
}

// Builder builds and keeps environments under one directory. Its methods
// are safe for concurrent use.
type Builder struct {
	dir   string
	index string // pip's --index-url; "" = pip's own default
	mu    sync.Mutex
	locks map[string]*sync.Mutex // one per environment: builds of one wait for each other
	// timeout bounds a build: BuildTimeout (a field so a test can lower it).
	timeout time.Duration
}

// New returns a builder keeping environments in dir (made if absent);
// index is the package index to install from without a wheelhouse ("" =
// pip's default, or its configuration).
func New(dir, index string) (*Builder, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("python environments: %w", err)
	}
	return &Builder{dir: dir, index: index, locks: map[string]*sync.Mutex{}, timeout: BuildTimeout}, nil
}

// Env is one built environment.
type Env struct {
	Dir string // the venv: Dir/bin/python
}

// Bin is the directory of the environment's programs.
func (e Env) Bin() string { return filepath.Join(e.Dir, "bin") }

// BuildError is a failed build: pip's (or venv's) last lines of output.
type BuildError struct {
	Step string // "venv" or "pip install"
	Tail string // the output's last lines
	Err  error
}

func (e *BuildError) Error() string {
	return fmt.Sprintf("building the python environment failed (%s: %v): %s", e.Step, e.Err, e.Tail)
}

func (e *BuildError) Unwrap() error { return e.Err }

// Key names the environment spec makes: a digest of the interpreter (its
// resolved path, and its file's identity), the requirements file's bytes,
// each wheel's name and size and the index. A change to any of them makes
// another environment.
func (b *Builder) Key(spec Spec) (string, error) {
	spec = spec.withDefaults()
	h := sha256.New()
	interp, err := filepath.EvalSymlinks(spec.Interpreter)
	if err != nil {
		return "", fmt.Errorf("python interpreter %s: %w", spec.Interpreter, err)
	}
	fi, err := os.Stat(interp)
	if err != nil {
		return "", fmt.Errorf("python interpreter %s: %w", spec.Interpreter, err)
	}
	fmt.Fprintf(h, "interpreter %s %d %d\n", interp, fi.Size(), fi.ModTime().UnixNano())
	reqs, err := os.ReadFile(spec.Requirements)
	if err != nil {
		return "", fmt.Errorf("python requirements: %w", err)
	}
	fmt.Fprintf(h, "requirements %d\n", len(reqs))
	h.Write(reqs)
	if spec.Wheelhouse != "" {
		ents, err := os.ReadDir(spec.Wheelhouse)
		if err != nil {
			return "", fmt.Errorf("python wheelhouse: %w", err)
		}
		names := make([]string, 0, len(ents))
		for _, e := range ents {
			fi, err := e.Info()
			if err != nil || !fi.Mode().IsRegular() {
				continue
			}
			names = append(names, fmt.Sprintf("%s %d", e.Name(), fi.Size()))
		}
		sort.Strings(names)
		fmt.Fprintf(h, "wheelhouse\n%s\n", strings.Join(names, "\n"))
	} else {
		fmt.Fprintf(h, "index %s\n", b.index)
	}
	return fmt.Sprintf("%x", h.Sum(nil))[:32], nil
}

func (s Spec) withDefaults() Spec {
	if s.Interpreter == "" {
		s.Interpreter = DefaultInterpreter
	}
	return s
}

// Ready returns the environment spec makes if it is built, without
// building it.
func (b *Builder) Ready(spec Spec) (Env, bool, error) {
	key, err := b.Key(spec)
	if err != nil {
		return Env{}, false, err
	}
	env := Env{Dir: filepath.Join(b.dir, key)}
	_, err = os.Stat(filepath.Join(env.Dir, readyMark))
	return env, err == nil, nil
}

// Ensure returns the environment spec makes, building it first when it is
// not built yet: building (when not nil) is called before a build starts,
// and the build's output goes to out. A build that fails leaves nothing,
// and its error (a *BuildError) carries pip's last lines.
func (b *Builder) Ensure(ctx context.Context, spec Spec, out io.Writer, building func()) (Env, error) {
	spec = spec.withDefaults()
	env, ok, err := b.Ready(spec)
	if err != nil || ok {
		return env, err
	}
	key := filepath.Base(env.Dir)
	unlock, err := b.lock(key)
	if err != nil {
		return Env{}, err
	}
	defer unlock()
	if _, err := os.Stat(filepath.Join(env.Dir, readyMark)); err == nil {
		return env, nil // built by whoever held the lock before us
	}
	if building != nil {
		building()
	}
	ctx, cancel := context.WithTimeout(ctx, b.timeout)
	defer cancel()
	if err := b.build(ctx, spec, env, out); err != nil {
		switch {
		case errors.Is(ctx.Err(), context.DeadlineExceeded):
			err = fmt.Errorf("%w (the build was stopped after %v)", err, b.timeout)
		case ctx.Err() != nil:
			err = fmt.Errorf("%w (the build was cancelled)", err)
		}
		os.RemoveAll(env.Dir)
		return Env{}, err
	}
	return env, nil
}

// lock holds environment key's lock, within this process and across
// processes (a lock file beside it).
func (b *Builder) lock(key string) (func(), error) {
	b.mu.Lock()
	m := b.locks[key]
	if m == nil {
		m = &sync.Mutex{}
		b.locks[key] = m
	}
	b.mu.Unlock()
	m.Lock()
	f, err := os.OpenFile(filepath.Join(b.dir, key+".lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		m.Unlock()
		return nil, fmt.Errorf("python environments: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		m.Unlock()
		return nil, fmt.Errorf("python environments: lock: %w", err)
	}
	return func() { f.Close(); m.Unlock() }, nil
}

// build makes env from spec: a venv of the interpreter, then pip installs
// the requirements into it, offline from the wheelhouse when there is one.
func (b *Builder) build(ctx context.Context, spec Spec, env Env, out io.Writer) error {
	os.RemoveAll(env.Dir) // a build cut short before
	tail := &tailWriter{}
	w := io.MultiWriter(out, tail)
	fmt.Fprintf(w, "inferd: building the python environment %s (%s, %s)\n", env.Dir, spec.Interpreter, spec.Requirements)
	run := func(step string, argv ...string) error {
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir = filepath.Dir(spec.Requirements) // relative paths in it are its own
		cmd.Stdout, cmd.Stderr = w, w
		// Killed at the timeout; a child it left holding the output goes
		// unread after this.
		cmd.WaitDelay = 5 * time.Second
		// A HOME of the build's own keeps pip's cache and configuration out
		// of the daemon's; nothing of the daemon's environment but PATH and
		// the locale goes to pip.
		cmd.Env = []string{"HOME=" + env.Dir + ".home", "PATH=/usr/local/bin:/usr/bin:/bin", "LANG=C.UTF-8",
			"PIP_DISABLE_PIP_VERSION_CHECK=1", "PIP_NO_INPUT=1", "PYTHONDONTWRITEBYTECODE=1"}
		if err := cmd.Run(); err != nil {
			return &BuildError{Step: step, Tail: tail.last(8), Err: err}
		}
		return nil
	}
	defer os.RemoveAll(env.Dir + ".home")
	if err := run("venv", spec.Interpreter, "-m", "venv", env.Dir); err != nil {
		return err
	}
	pip := []string{filepath.Join(env.Dir, "bin", "python"), "-m", "pip", "install", "--no-cache-dir", "--retries", "1", "--timeout", "15"}
	if spec.Wheelhouse != "" {
		pip = append(pip, "--no-index", "--find-links", spec.Wheelhouse)
	} else if b.index != "" {
		pip = append(pip, "--index-url", b.index)
	}
	pip = append(pip, "-r", spec.Requirements)
	if err := run("pip install", pip...); err != nil {
		return err
	}
	// Every replica's uid reads it; none may change it.
	if err := readOnlyForOthers(env.Dir); err != nil {
		return fmt.Errorf("python environment %s: %w", env.Dir, err)
	}
	fmt.Fprintf(w, "inferd: the python environment %s is ready\n", env.Dir)
	return os.WriteFile(filepath.Join(env.Dir, readyMark), nil, 0o644)
}

// readOnlyForOthers makes every file under dir readable by all, and
// writable by its owner only (pip keeps the umask's modes).
func readOnlyForOthers(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.Type()&fs.ModeSymlink != 0 {
			return nil
		}
		fi, err := d.Info()
		if err != nil {
			return err
		}
		mode := fi.Mode().Perm()&^0o022 | 0o444
		if fi.IsDir() || mode&0o100 != 0 {
			mode |= 0o111
		}
		return os.Chmod(p, mode)
	})
}

// tailWriter keeps the last lines written to it.
type tailWriter struct {
	mu  sync.Mutex
	buf []byte
}

const tailKeep = 8 << 10

func (t *tailWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if len(t.buf) > tailKeep {
		t.buf = t.buf[len(t.buf)-tailKeep:]
	}
	return len(p), nil
}

// last is the last n non-empty lines, joined by " | ".
func (t *tailWriter) last(n int) string {
	t.mu.Lock()
	defer t.mu.Unlock()
	var lines []string
	for _, l := range bytes.Split(t.buf, []byte("\n")) {
		if s := strings.TrimSpace(string(l)); s != "" {
			lines = append(lines, s)
		}
	}
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, " | ")
}
