package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"inferd/scheduler/backend"
)

// TestLogsAreClosedToOthersWhateverTheDataDirsMode: a data dir an admin
// made 0755, holding logs an older inferd left 0644, is closed when the
// backend starts (doctor, which changes nothing, says it is open until
// then); new logs are 0600 in 0700 dirs; and another project's model,
// under a uid of its own, cannot read them.
func TestLogsAreClosedToOthersWhateverTheDataDirsMode(t *testing.T) {
	needRoot(t)
	data := t.TempDir()
	logDir, runDir := filepath.Join(data, "logs"), filepath.Join(data, "run")
	oldLog := filepath.Join(logDir, "team", "proj-old", "old-1.log")
	// t.TempDir's parent is 0700: open it too, or nothing under it could
	// be reached by another uid whatever its own mode.
	for _, d := range []string{filepath.Dir(data), data, filepath.Dir(oldLog), runDir} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range []string{oldLog, filepath.Join(runDir, "old-1.pid")} {
		if err := os.WriteFile(f, []byte("secret\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if p := PrivateFiles(logDir, runDir); p.On || !strings.Contains(p.Detail, "6 logs, pid files or their dirs are open") {
		t.Errorf("before the backend starts: %+v, want off, counting 6 open", p)
	}

	b := testBackendWith(t, func(c *Config) {
		perProject(c)
		c.LogDir, c.RunDir, c.UIDFile = logDir, runDir, filepath.Join(runDir, "uids.json")
	})
	if p := protection(t, b, backend.ProtectionPrivateFiles); !p.On || !strings.Contains(p.Detail, "6 found open to others were closed") {
		t.Errorf("privateFiles after start: %+v", p)
	}
	if p := PrivateFiles(logDir, runDir); !p.On {
		t.Errorf("doctor after the start: %+v, want on", p)
	}

	writer := startModel(t, b, sandboxSpec("writer-1", `echo "the writer's secret"; echo done; exec sleep 1000`))
	waitLog(t, b, writer, "done")
	newLog := b.logPath(writer.spec)
	reader := startModel(t, b, sandboxSpec("reader-1", `cat `+newLog+` `+oldLog+` 2>&1; echo done; exec sleep 1000`))
	out := waitLog(t, b, reader, "done")
	if strings.Contains(out, "secret") || strings.Count(out, "Permission denied") != 2 {
		t.Errorf("another project's model reading the logs got:\n%s\nwant Permission denied twice", out)
	}
	err := filepath.WalkDir(data, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if fi, err := d.Info(); err == nil && fi.Mode()&os.ModeSymlink == 0 && fi.Mode().Perm()&0o077 != 0 && path != data {
			t.Errorf("%s is mode %o, open to others", path, fi.Mode().Perm())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
