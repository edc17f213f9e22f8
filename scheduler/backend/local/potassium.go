package local

import (
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
// start-up shim. Launch writes potassiumshim/sitecustomize.py into a folder of
// the replica's own (potassiumShimDir, in its private directory, which inferd
// makes afresh for each replica under a directory only inferd writes to: no
// model can squat it, as one could a fixed name in the shared temp dir, and
// keep another project's replicas from booting) and puts that folder first on
// the model's PYTHONPATH. Python imports
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

// potassiumShimDir is where the shim of the replica whose private
// directory is home goes.
func potassiumShimDir(home string) string { return filepath.Join(home, ".inferd-potassium") }

// preparePotassium writes the shim into x's private directory, owned by
// the model's user like the rest of it (so that clearing the directory as
// that user removes it), and returns the project's env with the shim's
// folder prepended to its PYTHONPATH. spec is left as it is.
func preparePotassium(spec backend.Spec, x *box) (map[string]string, error) {
	dir := potassiumShimDir(x.dir)
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, fmt.Errorf("potassium shim: %w", err)
	}
	path := filepath.Join(dir, "sitecustomize.py")
	if err := os.WriteFile(path, potassiumShim, 0o644); err != nil {
		return nil, fmt.Errorf("potassium shim: %w", err)
	}
	if r := x.runAs; r != nil {
		for _, p := range []string{dir, path} {
			if err := os.Lchown(p, int(r.UID), int(r.GID)); err != nil {
				return nil, fmt.Errorf("potassium shim: %w", err)
			}
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
