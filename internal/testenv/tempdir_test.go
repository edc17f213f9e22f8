package testenv

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// A shared temp dir is drwxrwxrwt whether it is new, or left by an older
// run without the sticky bit, and whatever the umask: without the bit any
// user may delete another's files in it.
func TestSharedTempDirIsStickyAndOpenToAll(t *testing.T) {
	old := syscall.Umask(0o077)
	defer syscall.Umask(old)
	fresh := filepath.Join(t.TempDir(), "fresh")
	left := filepath.Join(t.TempDir(), "left")
	if err := os.Mkdir(left, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(left, 0o777); err != nil { // as os.Chmod(dir, 0o1777) left it
		t.Fatal(err)
	}
	for name, dir := range map[string]string{"a new dir": fresh, "a dir without the sticky bit": left} {
		if err := makeSharedTemp(dir); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got := stat(t, dir); got != "dtrwxrwxrwx" {
			t.Errorf("%s: mode %s, want dtrwxrwxrwx (ls: drwxrwxrwt)", name, got)
		}
	}
}

// As root, the tests' own /tmp, /var/itmp, is drwxrwxrwt once
// ShareTempDirWithModels has run, as every e2e run's TestMain runs it.
func TestModelVisibleRootIsSticky(t *testing.T) {
	NeedRoot(t, "ShareTempDirWithModels makes /var/itmp only as root")
	restore, err := ShareTempDirWithModels()
	if err != nil {
		t.Fatal(err)
	}
	defer restore()
	if got := stat(t, ModelVisibleRoot); got != "dtrwxrwxrwx" {
		t.Errorf("%s: mode %s, want dtrwxrwxrwx (ls: drwxrwxrwt)", ModelVisibleRoot, got)
	}
}

func stat(t *testing.T, dir string) string {
	t.Helper()
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Mode().String()
}
