package replica

import (
	"bytes"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"inferd/store"
)

// Protocol "potassium" runs apps written for Banana's Potassium framework (0.5)
// unchanged. Such an app ends with app.serve(), whose host and port default to
// 0.0.0.0:8000, so every replica of it asks for the same port and only the first
// could bind it.
//
// The fix lives here and only here: a Python start-up shim. Start writes
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
// a traceback as *ExceptionError) is in Infer; see docs/protocols.md.

// ProtocolPotassium is the Spec.Protocol of Potassium apps.
const ProtocolPotassium = store.ProtocolPotassium

// potassiumShim is the sitecustomize.py that redirects port 8000 to $PORT.
//
//go:embed potassiumshim/sitecustomize.py
var potassiumShim []byte

// potassiumShimDir returns the directory the shim is written to for spec.
// A model running as another user cannot enter the data dir (mode 0700), so
// its shim goes to a directory of inferd's user under the system temp dir.
func potassiumShimDir(spec Spec) string {
	if spec.RunAs != nil {
		return filepath.Join(os.TempDir(), fmt.Sprintf(".inferd-potassium-shim-%d", os.Geteuid()))
	}
	if spec.LogPath == "" {
		return filepath.Join(os.TempDir(), ".inferd-potassium-shim")
	}
	return filepath.Join(filepath.Dir(spec.LogPath), ".potassium-shim")
}

// preparePotassium writes the shim (idempotent: rewritten through a temporary file
// and a rename only when its content differs, so replicas starting at once never
// see a partial file) and returns spec with the shim directory prepended to the
// project's PYTHONPATH.
func preparePotassium(spec Spec) (Spec, error) {
	dir := potassiumShimDir(spec)
	mkdir := func(dir string) error { return os.MkdirAll(dir, 0o755) }
	if spec.RunAs != nil {
		mkdir = sharedDir
	}
	if err := mkdir(dir); err != nil {
		return spec, fmt.Errorf("potassium shim: %w", err)
	}
	path := filepath.Join(dir, "sitecustomize.py")
	if cur, err := os.ReadFile(path); err != nil || !bytes.Equal(cur, potassiumShim) {
		tmp, err := os.CreateTemp(dir, ".sitecustomize-*.tmp")
		if err != nil {
			return spec, fmt.Errorf("potassium shim: %w", err)
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
			return spec, fmt.Errorf("potassium shim: %w", werr)
		}
	}
	env := make(map[string]string, len(spec.Env)+1)
	for k, v := range spec.Env {
		env[k] = v
	}
	pp := dir
	if old := env["PYTHONPATH"]; old != "" {
		pp += string(os.PathListSeparator) + old
	}
	env["PYTHONPATH"] = pp
	spec.Env = env
	return spec, nil
}

// lastTracebackLine returns the last non-empty line of a traceback, trimmed, e.g.
// "ValueError: bad prompt".
func lastTracebackLine(body string) string {
	lines := strings.Split(strings.TrimRight(body, "\r\n\t "), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}
