package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// ModelVisibleRoot is where ShareTempDirWithModels puts a test binary's
// temporary files when it runs as root.
const ModelVisibleRoot = "/var/lib/inferd-tests"

// ShareTempDirWithModels points TMPDIR, and so t.TempDir and os.MkdirTemp,
// at a fresh directory that model processes see as the test does, and
// returns a function that removes it; call it from TestMain before m.Run.
//
// As root, inferd gives every replica a /tmp, /var/tmp and /dev/shm of its
// own (a mount namespace: docs/security.md), so a file a test shares with a
// model (a flag the model waits on, a log it appends to) must live
// elsewhere: under ModelVisibleRoot, which any user may traverse. Not as
// root, replicas share the host's /tmp and nothing changes.
func ShareTempDirWithModels() (cleanup func(), err error) {
	if os.Geteuid() != 0 || strings.HasPrefix(os.TempDir(), ModelVisibleRoot+"/") {
		return func() {}, nil // not root, or a helper process of a test that did it
	}
	if err := os.MkdirAll(ModelVisibleRoot, 0o755); err != nil {
		return nil, fmt.Errorf("temp dir for tests and their models: %w", err)
	}
	dir, err := os.MkdirTemp(ModelVisibleRoot, filepath.Base(os.Args[0])+"-")
	if err != nil {
		return nil, fmt.Errorf("temp dir for tests and their models: %w", err)
	}
	// MkdirTemp makes it 0700; like /tmp it must let models in (what is
	// made in it keeps its own modes: t.TempDir's are 0700 too).
	if err := os.Chmod(dir, 0o1777); err != nil {
		os.Remove(dir)
		return nil, err
	}
	old, had := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", dir)
	return func() {
		if had {
			os.Setenv("TMPDIR", old)
		} else {
			os.Unsetenv("TMPDIR")
		}
		os.RemoveAll(dir)
	}, nil
}
