package local

import (
	"context"
	"errors"
	"io"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"inferd/pyenv"
	"inferd/scheduler/backend"
)

// A project with python: runs its model in a Python virtual environment
// built from its requirements (package pyenv; docs/python.md), as if the
// environment were activated: its bin first on PATH, VIRTUAL_ENV set, so
// that `python3 server.py` is the environment's interpreter. The first
// replica of an environment builds it, its output in the replica's log;
// every later one, of any project asking for the same environment, finds
// it built.
//
// The environments live under the data dir, which only inferd's user may
// enter (nor, often, some directory above it). A replica under a uid of
// its own reaches its environment because its mount namespace covers the
// outermost such directory with an empty tmpfs and binds the environment
// back in at its own path (replicainit's Hide; closedAncestor): the model
// sees its environment and nothing else of the data dir.

// pythonEnv makes sure spec's environment is built, building it (its
// output to log) if not, and tells spec.Phase while it builds.
func (b *Backend) pythonEnv(spec backend.Spec, log io.Writer) (*pyenv.Env, error) {
	py := spec.Model.Python
	if !py.On() {
		return nil, nil
	}
	if b.pyenvs == nil {
		return nil, errors.New("this daemon builds no python environments (no data dir)")
	}
	// A replica stopped while it builds (its project deleted) stops the
	// build.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if spec.Cancel != nil {
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-spec.Cancel:
				cancel()
			case <-done:
			}
		}()
	}
	building := false
	env, err := b.pyenvs.Ensure(ctx, pyenv.Spec{Requirements: py.Requirements, Wheelhouse: py.Wheelhouse, Interpreter: py.Interpreter}, log, func() {
		building = true
		if spec.Phase != nil {
			spec.Phase(backend.PhaseBuildingEnvironment)
		}
	})
	if building && spec.Phase != nil {
		spec.Phase("")
	}
	if err != nil {
		return nil, err
	}
	return &env, nil
}

// activated is the project's env with the environment activated: its bin
// first on PATH (the project's PATH, else the daemon's), VIRTUAL_ENV set.
func activated(env map[string]string, venv *pyenv.Env) map[string]string {
	out := maps.Clone(env)
	if out == nil {
		out = map[string]string{}
	}
	path, ok := env["PATH"]
	if !ok {
		path = os.Getenv("PATH")
	}
	out["PATH"] = venv.Bin() + string(filepath.ListSeparator) + path
	out["VIRTUAL_ENV"] = venv.Dir
	return out
}

// closedAncestor is the outermost directory on the way to dir (dir
// included) that other users may not pass: the one a replica's mount
// namespace covers with an empty tmpfs, so that the environments under it
// can be bound back where a model's uid reaches them. "" when every one is
// open.
func closedAncestor(dir string) string {
	dir = filepath.Clean(dir)
	for p := string(filepath.Separator); ; {
		if fi, err := os.Stat(p); err == nil && fi.Mode().Perm()&0o001 == 0 {
			return p
		}
		if p == dir {
			return ""
		}
		rest, _ := filepath.Rel(p, dir)
		first, _, _ := strings.Cut(rest, string(filepath.Separator))
		p = filepath.Join(p, first)
	}
}

// lookPath finds program on the daemon's PATH, in venv's bin first.
func lookPath(program string, venv *pyenv.Env) (string, error) {
	if venv != nil {
		if p := filepath.Join(venv.Bin(), program); isExecutable(p) {
			return p, nil
		}
	}
	return exec.LookPath(program)
}

func isExecutable(p string) bool {
	fi, err := os.Stat(p)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}
