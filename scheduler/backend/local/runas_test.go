package local

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"inferd/internal/testenv"
)

func TestLookupRunAs(t *testing.T) {
	u, err := LookupRunAs("nobody")
	if err != nil {
		testenv.Missing(t, "a user named nobody: %v", err)
	}
	if u.UID == 0 || u.Name != "nobody" {
		t.Errorf("nobody resolved to %+v", u)
	}
	if byID, err := LookupRunAs(strconv.FormatUint(uint64(u.UID), 10)); err != nil || byID.UID != u.UID {
		t.Errorf("by uid: %+v %v", byID, err)
	}
	if _, err := LookupRunAs("root"); err == nil || !strings.Contains(err.Error(), "root") {
		t.Errorf("root must be refused as a model user, got %v", err)
	}
	if _, err := LookupRunAs("no-such-user-inferd"); err == nil {
		t.Error("an unknown user must be an error")
	}
}

func TestOwnedDirRefusesADirectoryOthersCanWrite(t *testing.T) {
	base := t.TempDir()
	ok := filepath.Join(base, "ok")
	if err := ownedDir(ok, 0o755); err != nil {
		t.Fatal(err)
	}
	if fi, _ := os.Stat(ok); fi.Mode().Perm() != 0o755 {
		t.Errorf("mode %v, want 0755", fi.Mode().Perm())
	}
	if err := ownedDir(ok, 0o755); err != nil {
		t.Errorf("reusing our own directory: %v", err)
	}

	open := filepath.Join(base, "open")
	if err := os.Mkdir(open, 0o777); err != nil {
		t.Fatal(err)
	}
	os.Chmod(open, 0o777) // past the umask
	if err := ownedDir(open, 0o755); err == nil || !strings.Contains(err.Error(), "writable by others") {
		t.Errorf("a world-writable directory: %v", err)
	}

	link := filepath.Join(base, "link")
	if err := os.Symlink(ok, link); err != nil {
		t.Fatal(err)
	}
	if err := ownedDir(link, 0o755); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a symlink: %v", err)
	}
}
