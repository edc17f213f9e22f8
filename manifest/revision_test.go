package manifest

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

// An apply rolls a project when its model's code changed: the directory's
// hash changes with what the model runs, and only with that.
func TestDirRevisionChangesWithTheModelsCodeOnly(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, dir string)
		rolls  bool
	}{
		{"nothing", func(*testing.T, string) {}, false},
		{"a file's content", func(t *testing.T, dir string) { write(t, dir, "server.py", "print('v2')") }, true},
		{"a new file", func(t *testing.T, dir string) { write(t, dir, "lib/extra.py", "") }, true},
		{"a removed file", func(t *testing.T, dir string) { rm(t, dir, "lib/util.py") }, true},
		{"a file's mode", func(t *testing.T, dir string) { chmod(t, dir, "server.py", 0o700) }, true},
		{"a renamed file", func(t *testing.T, dir string) { mv(t, dir, "lib/util.py", "lib/util2.py") }, true},
		{"a link's target", func(t *testing.T, dir string) { relink(t, dir, "current", "lib/util.py") }, true},
		{"Python's byte code cache", func(t *testing.T, dir string) { write(t, dir, "lib/__pycache__/util.cpython-311.pyc", "x") }, false},
		{"version control", func(t *testing.T, dir string) { write(t, dir, ".git/HEAD", "ref: refs/heads/other") }, false},
		{"a modification time alone", func(t *testing.T, dir string) { touch(t, dir, "server.py") }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, dir, "server.py", "print('v1')")
			write(t, dir, "lib/util.py", "X = 1")
			write(t, dir, ".git/HEAD", "ref: refs/heads/main")
			relink(t, dir, "current", "server.py")
			before := revision(t, dir)
			if !strings.HasPrefix(before, "dir:") || len(before) != len("dir:")+64 {
				t.Fatalf("revision = %q, want dir: and a SHA-256", before)
			}
			tc.change(t, dir)
			if after := revision(t, dir); (after != before) != tc.rolls {
				t.Errorf("after %s: revision %s -> %s; want a change: %v", tc.name, before, after, tc.rolls)
			}
		})
	}
}

// Past the bytes it reads, a file counts by size and modification time; past
// the files it visits, the directory gets no hash and apply says what to do.
func TestDirRevisionIsBounded(t *testing.T) {
	dir := t.TempDir()
	write(t, dir, "a.py", "small")
	write(t, dir, "weights.bin", strings.Repeat("w", 100))
	rev, err := dirRevision(dir, 10, 10)
	if err != nil {
		t.Fatal(err)
	}
	write(t, dir, "weights.bin", strings.Repeat("v", 100)) // same size
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(filepath.Join(dir, "weights.bin"), past, past); err != nil {
		t.Fatal(err)
	}
	if again, _ := dirRevision(dir, 10, 10); again == rev {
		t.Error("a large file with a new modification time kept the revision")
	}
	for i := range 11 {
		write(t, dir, filepath.Join("many", strings.Repeat("f", i+1)), "")
	}
	if _, err := dirRevision(dir, 10, 10); err == nil || !strings.Contains(err.Error(), "more than 10 files") {
		t.Errorf("a dir past the file bound: err = %v", err)
	}

	ps := []store.Project{{ID: "big", Model: store.ModelSpec{Dir: dir}}, {ID: "named", Model: store.ModelSpec{Dir: dir, Revision: "v7"}}}
	if w := StampRevisions(ps); len(w) != 0 || ps[0].Model.Revision == "" || ps[1].Model.Revision != "v7" {
		t.Errorf("StampRevisions within the bounds: warnings %q, revisions %q, %q", w, ps[0].Model.Revision, ps[1].Model.Revision)
	}
}

func TestStampRevisionsWarnsWhenADirCannotBeHashed(t *testing.T) {
	dir := t.TempDir()
	for i := range MaxHashedFiles + 1 {
		write(t, dir, "f"+strconv.Itoa(i), "")
	}
	ps := []store.Project{{ID: "huge", Model: store.ModelSpec{Dir: dir}}, {ID: "gone", Model: store.ModelSpec{Dir: filepath.Join(dir, "nope")}}}
	w := StampRevisions(ps)
	if len(w) != 1 || !strings.Contains(w[0], "project huge:") || !strings.Contains(w[0], "revision:") || !strings.Contains(w[0], "inferd project restart huge") {
		t.Errorf("warnings = %q, want one for huge naming revision: and project restart", w)
	}
	if ps[0].Model.Revision != "" || ps[1].Model.Revision != "" {
		t.Errorf("revisions %q, %q; want none", ps[0].Model.Revision, ps[1].Model.Revision)
	}
}

func revision(t *testing.T, dir string) string {
	t.Helper()
	rev, err := DirRevision(dir)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func rm(t *testing.T, dir, name string) {
	t.Helper()
	if err := os.Remove(filepath.Join(dir, name)); err != nil {
		t.Fatal(err)
	}
}

func mv(t *testing.T, dir, from, to string) {
	t.Helper()
	if err := os.Rename(filepath.Join(dir, from), filepath.Join(dir, to)); err != nil {
		t.Fatal(err)
	}
}

func chmod(t *testing.T, dir, name string, mode os.FileMode) {
	t.Helper()
	if err := os.Chmod(filepath.Join(dir, name), mode); err != nil {
		t.Fatal(err)
	}
}

func touch(t *testing.T, dir, name string) {
	t.Helper()
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(filepath.Join(dir, name), later, later); err != nil {
		t.Fatal(err)
	}
}

func relink(t *testing.T, dir, name, target string) {
	t.Helper()
	path := filepath.Join(dir, name)
	_ = os.Remove(path)
	if err := os.Symlink(target, path); err != nil {
		t.Fatal(err)
	}
}
