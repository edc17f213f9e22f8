package cli

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"inferd/store/bolt"
)

// TestRestoreMovesALeftoverLogAsideWithTheDataFile: a daemon killed before
// its write-ahead log was folded into the data file leaves the log beside
// it. Restore moves it aside with the file it belongs to, so that the
// restored backup opens on its own and the file set aside opens whole.
func TestRestoreMovesALeftoverLogAsideWithTheDataFile(t *testing.T) {
	dir := t.TempDir()
	backup := filepath.Join(dir, "backup.db")
	st, err := bolt.Open(backup, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	dataDir := filepath.Join(dir, "data")
	cur := filepath.Join(dataDir, "inferd.db")
	st, err = bolt.Open(cur, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	st.Close()
	leftover := cur + ".wal.0000000003"
	if err := os.WriteFile(leftover, []byte("the killed daemon's log"), 0o600); err != nil {
		t.Fatal(err)
	}

	r := runCLI(t, nil, "--data-dir", dataDir, "restore", backup)
	if r.code != 0 {
		t.Fatalf("restore: exit %d, stderr %q", r.code, r.stderr)
	}
	if files, _ := bolt.WALFiles(cur); len(files) != 0 {
		t.Errorf("log files beside the restored data file: %v", files)
	}
	aside, _ := filepath.Glob(cur + ".before-restore-*")
	var file, log string
	for _, a := range aside {
		if strings.Contains(a, ".wal.") {
			log = a
		} else {
			file = a
		}
	}
	if file == "" || log != file+".wal.0000000003" {
		t.Fatalf("set aside: %v; want the data file and its log under one name", aside)
	}
	if b, err := os.ReadFile(log); err != nil || string(b) != "the killed daemon's log" {
		t.Errorf("the log set aside = %q, %v", b, err)
	}
}
