package durable

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
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
