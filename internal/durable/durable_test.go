package durable

import (
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"inferd/internal/testenv"
)

// A fill that fails leaves the old content in place and no temporary file
// behind; one that succeeds replaces it whole.
func TestReplaceKeepsTheOldContentUntilTheNewIsWhole(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "f")
	if err := os.WriteFile(path, []byte("old"), 0o600); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("boom")
	err := Replace(path, func(w io.Writer) error {
		if _, err := io.WriteString(w, "half of the new"); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("Replace with a failing fill = %v, want fill's error", err)
	}
	if b, _ := os.ReadFile(path); string(b) != "old" {
		t.Errorf("after a failed fill the file holds %q, want the old content", b)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, TempPrefix+"*")); len(left) != 0 {
		t.Errorf("a failed fill left %v", left)
	}

	if err := Replace(path, func(w io.Writer) error { _, err := io.WriteString(w, "new"); return err }); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(path); string(b) != "new" {
		t.Errorf("after Replace the file holds %q, want %q", b, "new")
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 1 {
		t.Errorf("the directory holds %d entries, want the file alone", len(entries))
	}
	if err := Remove(path); err != nil {
		t.Fatal(err)
	}
	if err := Remove(path); err != nil {
		t.Errorf("Remove of a file already gone = %v, want nil", err)
	}
}

// durableChildEnv, set to a directory, makes TestReplaceAndRemoveSyncBeforeTheyReturn
// the traced child: it replaces and removes a file there.
const durableChildEnv = "INFERD_DURABLE_CHILD"

// TestReplaceAndRemoveSyncBeforeTheyReturn runs a child process (this test
// binary) under strace, which replaces a file and removes it: Replace must
// fsync the temporary file before it renames it into place (else a crash
// can leave the new name on empty or partial content) and the directory
// after (else the rename itself can be lost), Remove the directory after
// the unlink. A Replace that skipped either sync still passes every test of
// content above; only the system calls show it.
func TestReplaceAndRemoveSyncBeforeTheyReturn(t *testing.T) {
	if dir := os.Getenv(durableChildEnv); dir != "" {
		path := filepath.Join(dir, "f")
		if err := Replace(path, func(w io.Writer) error { _, err := io.WriteString(w, "new"); return err }); err != nil {
			t.Fatal(err)
		}
		if err := Remove(path); err != nil {
			t.Fatal(err)
		}
		return
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		testenv.Missing(t, "strace, to see the syncs (scripts/test-deps.sh installs it)")
	}
	dir, err := filepath.EvalSymlinks(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	trace := filepath.Join(dir, "trace")
	cmd := exec.Command(strace, "-f", "-qq", "-y", "-s", "256", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2,unlink,unlinkat",
		"-e", "signal=none", "-o", trace, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1")
	cmd.Env = append(os.Environ(), durableChildEnv+"="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		if strings.Contains(string(out), "ptrace") {
			testenv.Missing(t, "ptrace for strace: %s", out)
		}
		t.Fatalf("the traced child: %v\n%s", err, out)
	}
	b, err := os.ReadFile(trace)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	// first is the index of the first line at or after from that matches
	// re, or -1.
	first := func(from int, re string) int {
		r := regexp.MustCompile(re)
		for i := max(from, 0); i < len(lines); i++ {
			if r.MatchString(lines[i]) {
				return i
			}
		}
		return -1
	}
	quoted := regexp.QuoteMeta(dir)
	rename := first(0, `rename.*`+regexp.QuoteMeta(TempPrefix)+`.*"`+quoted+`/f"`)
	unlink := first(0, `unlink.*"`+quoted+`/f"`)
	if rename < 0 || unlink < 0 {
		t.Fatalf("no rename of the temporary file onto f, or no unlink of f, in the trace:\n%s", b)
	}
	if sync := first(0, `f(data)?sync\(\d+<`+quoted+`/`+regexp.QuoteMeta(TempPrefix)); sync < 0 || sync > rename {
		t.Errorf("Replace renamed its temporary file into place before it synced it (sync at line %d, rename at %d):\n%s", sync, rename, b)
	}
	if sync := first(rename, `fsync\(\d+<`+quoted+`>\)`); sync < 0 || sync > unlink {
		t.Errorf("Replace returned without syncing the directory after its rename:\n%s", b)
	}
	if sync := first(unlink, `fsync\(\d+<`+quoted+`>\)`); sync < 0 {
		t.Errorf("Remove returned without syncing the directory after its unlink:\n%s", b)
	}
}
