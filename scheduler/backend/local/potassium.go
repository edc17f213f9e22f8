package local

import (
	"bytes"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"

	"inferd/scheduler/backend"
)

// Protocol "potassium" runs apps written for Banana's Potassium framework (0.5)
// unchanged. Such an app ends with app.serve(), whose host and port default to
// 0.0.0.0:8000, so every replica of it asks for the same port and only the first
// could bind it.
//
// In a private network namespace (replica.network: private, the default when
// inferd may make one) there is nothing to fix: each replica has a port 8000
// of its own, and inferd dials it there. Otherwise (inferd not root, or a
// project with network: host) the fix lives here and only here: a Python
// start-up shim. Launch writes
// potassiumshim/sitecustomize.py into a shim directory (".potassium-shim" next to
// the replica's log file, so in the daemon's data dir; os.TempDir() without a log)
// and puts that directory first on the model's PYTHONPATH. Python imports
// sitecustomize at start-up; ours replaces socket.socket.bind so that a bind to port
// 8000, on any host, binds 127.0.0.1:$PORT instead. Each replica thus listens on its
// own loopback port, as for the http protocol, and is not reachable from outside.
//
// Limits: it works only when the model is a Python process that honours PYTHONPATH
// (not with python -S/-I, or a wrapper that resets the environment); any Python
// child of the model that binds 8000 is redirected to the same PORT as well (and
// fails with "address in use"); a user's own sitecustomize.py is shadowed by ours,
// which then runs it itself (the next one found on sys.path) after patching bind.
//
// The protocol's wire side (status route, X-Banana-Request-Id, text/plain 500s with
// a traceback as *backend.ExceptionError) is in package protocol; see
// docs/protocols.md.

// potassiumShim is the sitecustomize.py that redirects port 8000 to $PORT.
//
//go:embed potassiumshim/sitecustomize.py
var potassiumShim []byte

// potassiumShimDir returns the directory the shim is written to for spec.
// A model running as another user (runAs) cannot enter the data dir (mode
// 0700), so its shim goes to a directory of inferd's user under the system
// temp dir.
func (b *Backend) potassiumShimDir(spec backend.Spec, runAs *RunAs) string {
	if runAs != nil {
		return filepath.Join(os.TempDir(), fmt.Sprintf(".inferd-potassium-shim-%d", os.Geteuid()))
	}
	if b.cfg.LogDir == "" {
		return filepath.Join(os.TempDir(), ".inferd-potassium-shim")
	}
	return filepath.Join(filepath.Dir(b.logPath(spec)), ".potassium-shim")
}

// preparePotassium writes the shim (idempotent: rewritten through a temporary file
// and a rename only when its content differs, so replicas starting at once never
// see a partial file) and returns the project's env with the shim directory
// prepended to its PYTHONPATH. spec is left as it is.
func (b *Backend) preparePotassium(spec backend.Spec, runAs *RunAs) (map[string]string, error) {
	dir := b.potassiumShimDir(spec, runAs)
	mkdir := func(dir string) error { return os.MkdirAll(dir, 0o755) }
	if runAs != nil {
		mkdir = func(dir string) error { return ownedDir(dir, 0o755) }
	}
	if err := mkdir(dir); err != nil {
		return nil, fmt.Errorf("potassium shim: %w", err)
	}
	path := filepath.Join(dir, "sitecustomize.py")
	if cur, err := os.ReadFile(path); err != nil || !bytes.Equal(cur, potassiumShim) {
		tmp, err := os.CreateTemp(dir, ".sitecustomize-*.tmp")
		if err != nil {
			return nil, fmt.Errorf("potassium shim: %w", err)
		}
		_, werr := tmp.Write(potassiumShim)
		cerr := tmp.Close()
		if werr == nil {
			werr = cerr
		}
		if werr == nil {
			werr = os.Chmod(tmp.Name(), 0o644)
		}
		if werr == nil {
			werr = os.Rename(tmp.Name(), path)
		}
		if werr != nil {
			os.Remove(tmp.Name())
			return nil, fmt.Errorf("potassium shim: %w", werr)
		}
	}
	env := make(map[string]string, len(spec.Model.Env)+1)
	for k, v := range spec.Model.Env {
		env[k] = v
	}
	pp := dir
	if old := env["PYTHONPATH"]; old != "" {
		pp += string(os.PathListSeparator) + old
	}
	env["PYTHONPATH"] = pp
	return env, nil
}
