package testenv

import (
	"fmt"
	"os"
)

// ModelVisibleRoot is the temp dir ShareTempDirWithModels gives a test
// binary that runs as root: a /tmp of the tests', made like /tmp
// (drwxrwxrwt: anyone may make files there, only their owner may delete
// them), where t.TempDir and os.MkdirTemp make names of their own. It is
// short because a daemon's admin socket sits in a t.TempDir and a socket's
// path may hold 107 bytes: with t.TempDir's names (at most 74 bytes) and
// "/001/data/inferd.sock", this leaves 2 to spare.
const ModelVisibleRoot = "/var/itmp"

// ShareTempDirWithModels points TMPDIR, and so t.TempDir and os.MkdirTemp,
// at ModelVisibleRoot, which model processes see as the test does, and
// returns a function that restores it; call it from TestMain before m.Run.
//
// As root, inferd gives every replica a /tmp, /var/tmp and /dev/shm of its
// own (a mount namespace: docs/security.md), so a file a test shares with a
// model (a flag the model waits on, a log it appends to, the model's own
// code) must live elsewhere. Not as root, replicas share the host's /tmp
// and nothing changes.
func ShareTempDirWithModels() (restore func(), err error) {
	if os.Geteuid() != 0 {
		return func() {}, nil
	}
	if err := makeSharedTemp(ModelVisibleRoot); err != nil {
		return nil, fmt.Errorf("temp dir for tests and their models: %w", err)
	}
	old, had := os.LookupEnv("TMPDIR")
	os.Setenv("TMPDIR", ModelVisibleRoot)
	return func() {
		if had {
			os.Setenv("TMPDIR", old)
		} else {
			os.Unsetenv("TMPDIR")
		}
	}, nil
}

// SharedTempMode is the mode of a temp dir every user shares, as /tmp's:
// drwxrwxrwt. The sticky bit must be os.ModeSticky: Go's os package reads
// only the permission bits of a mode written as the octal 0o1777, so that
// number makes the dir world-writable without the sticky bit, and any user
// could delete another's files in it.
const SharedTempMode = os.ModeSticky | 0o777

// makeSharedTemp makes dir, or finds it, and gives it SharedTempMode
// whatever the umask (or an older run's chmod) made of it.
func makeSharedTemp(dir string) error {
	if err := os.Mkdir(dir, SharedTempMode); err != nil && !os.IsExist(err) {
		return err
	}
	return os.Chmod(dir, SharedTempMode)
}
