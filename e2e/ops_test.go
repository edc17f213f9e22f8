package e2e

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"inferd/internal/testenv"
	"inferd/store/bolt"
)

// TestBackupWhileServingAndRestoreElsewhere takes a backup while the daemon
// serves, restores it into a fresh data dir, and serves the restored data.
func TestBackupWhileServingAndRestoreElsewhere(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	mark := marker()
	dir, cfgPath := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfgPath)
	secret := d.createKey("acme", false)
	d.apply("projects:\n" +
		echoProject("one", "acme", "mk-one", echo, mark, "") + "    minReplicas: 0\n" +
		echoProject("two", "acme", "mk-two", echo, mark, "") + "    minReplicas: 0\n")

	backup := filepath.Join(t.TempDir(), "inferd-backup.db")
	out, err := d.cli("backup", backup)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "backup written to "+backup) || !strings.Contains(out, "1 teams, 2 projects") {
		t.Errorf("backup output = %q", out)
	}
	if _, err := os.Stat(backup + ".tmp"); !os.IsNotExist(err) {
		t.Errorf("backup left %s.tmp behind (%v)", backup, err)
	}
	// An existing FILE is kept unless --force.
	if _, err := d.cli("backup", backup); err == nil || !strings.Contains(err.Error(), "--force") {
		t.Errorf("backup over an existing file: err = %v, want a refusal naming --force", err)
	}
	if _, err := d.cli("backup", "--force", backup); err != nil {
		t.Errorf("backup --force: %v", err)
	}

	// restore refuses while the daemon serves.
	if _, err := d.cli("restore", backup); err == nil || !strings.Contains(err.Error(), "stop the daemon first") {
		t.Errorf("restore while serving: err = %v, want a refusal", err)
	}
	d.stop()

	// Restore into a fresh data dir and serve from it.
	dir2, cfgPath2 := newDaemonDir(t, "")
	out, err = runCLI(cfgPath2, "restore", backup)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "restored "+backup) {
		t.Errorf("restore output = %q", out)
	}
	d2 := startDaemon(t, dir2, cfgPath2)
	status, obj := do(t, "GET", d2.base+"/v1/projects", map[string]string{"X-Service-API-Key": secret}, "")
	if status != 200 {
		t.Fatalf("GET /v1/projects with the restored key: HTTP %d: %v", status, obj)
	}
	results, _ := obj["results"].([]any)
	var ids []string
	for _, r := range results {
		if m, ok := r.(map[string]any); ok {
			id, _ := m["id"].(string)
			ids = append(ids, id)
		}
	}
	if strings.Join(ids, ",") != "one,two" {
		t.Errorf("restored projects = %v (%v), want one,two", ids, obj)
	}
	d2.stop()

	// A second restore moves the current data file aside.
	out, err = runCLI(cfgPath2, "restore", backup)
	if err != nil {
		t.Fatal(err)
	}
	aside, _ := filepath.Glob(filepath.Join(dir2, "data", "inferd.db.before-restore-*"))
	if len(aside) != 1 || !strings.Contains(out, aside[0]) {
		t.Errorf("restore over an existing data file: aside = %v, output %q", aside, out)
	}
}

func TestRestoreRefusesCorruptFile(t *testing.T) {
	t.Parallel()
	dir, cfgPath := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfgPath)
	d.createKey("acme", false)
	d.stop()
	before, err := os.ReadFile(filepath.Join(dir, "data", "inferd.db"))
	if err != nil {
		t.Fatal(err)
	}

	junk := filepath.Join(t.TempDir(), "junk.db")
	b := make([]byte, 64<<10)
	rand.Read(b)
	if err := os.WriteFile(junk, b, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = runCLI(cfgPath, "restore", junk)
	if err == nil || !strings.Contains(err.Error(), "not a usable inferd backup") || !strings.Contains(err.Error(), "corrupt") ||
		strings.Contains(err.Error(), "restore from a backup") {
		t.Fatalf("restore of random bytes: err = %v, want it refused as not a usable backup, with the store's reason", err)
	}
	after, err := os.ReadFile(filepath.Join(dir, "data", "inferd.db"))
	if err != nil || string(after) != string(before) {
		t.Errorf("a refused restore changed the data file (err %v)", err)
	}
	if aside, _ := filepath.Glob(filepath.Join(dir, "data", "inferd.db.before-restore-*")); len(aside) != 0 {
		t.Errorf("a refused restore moved the data file aside: %v", aside)
	}
}

func TestBackupOffline(t *testing.T) {
	t.Parallel()
	dir, cfgPath := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfgPath)
	d.createKey("acme", false)
	d.stop()
	backup := filepath.Join(t.TempDir(), "offline.db")
	out, err := runCLI(cfgPath, "backup", backup)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "1 teams, 0 projects") {
		t.Errorf("offline backup output = %q", out)
	}
}

func TestDoctorReports(t *testing.T) {
	t.Parallel()
	echoDir(t)
	// Models run as the test's user, as startDaemon has them (the default
	// unprivileged user may not reach a python3 under /root).
	dir, cfgPath := newDaemonDir(t, "replica:\n  user: root\n")
	check := func(out string) {
		t.Helper()
		for _, name := range []string{"config", "data dir", "data file", "disk", "gpu", "model user", "python3", "example", "listen"} {
			found := false
			for _, line := range strings.Split(out, "\n") {
				f := strings.Fields(line)
				if len(f) >= 2 && (f[0] == "ok" || f[0] == "warn" || f[0] == "fail") && strings.HasPrefix(strings.Join(f[1:], " "), name) {
					found = true
				}
			}
			if !found {
				t.Errorf("doctor printed no line for %q:\n%s", name, out)
			}
		}
		if !strings.Contains(out, "NVIDIA") {
			t.Errorf("doctor does not mention the NVIDIA driver:\n%s", out)
		}
		// python3 is here (echoDir skips otherwise) and so is examples/echo.
		if !strings.Contains(out, "ok    example") || !strings.Contains(out, "answers /healthz") {
			t.Errorf("doctor did not boot the example model:\n%s", out)
		}
	}
	// Before the first start: exit 0 or 1, never a usage error.
	out, err := runCLI(cfgPath, "doctor")
	if err != nil && !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("doctor: %v", err)
	}
	check(out)
	if !strings.Contains(out, cfgPath) {
		t.Errorf("doctor does not name the config file:\n%s", out)
	}

	// While a daemon serves: its socket answers and its port is its own.
	d := startDaemon(t, dir, cfgPath)
	out, err = d.cli("doctor")
	if err != nil && !strings.Contains(err.Error(), "exit status 1") {
		t.Fatalf("doctor: %v", err)
	}
	check(out)
	if !strings.Contains(out, "daemon running (admin socket answers)") || !strings.Contains(out, "in use by the running daemon") {
		t.Errorf("doctor with a daemon running:\n%s", out)
	}

	// After a stop: doctor reads the data file without changing it (it never
	// migrates: the daemon does that) and reports its schema version.
	d.stop()
	dbPath := filepath.Join(dir, "data", "inferd.db")
	before, err := os.ReadFile(dbPath)
	if err != nil {
		t.Fatal(err)
	}
	out, _ = runCLI(cfgPath, "doctor")
	if !strings.Contains(out, "opens (") || !strings.Contains(out, fmt.Sprintf("schema version %d)", bolt.SchemaVersion)) {
		t.Errorf("doctor on a stopped daemon's data file:\n%s", out)
	}
	if after, _ := os.ReadFile(dbPath); !bytes.Equal(before, after) {
		t.Error("doctor changed the data file")
	}

	// A broken config is a failed check, not a crash.
	bad := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(bad, []byte("listen: [\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err = runCLI(bad, "doctor")
	if err == nil || !strings.HasPrefix(out, "fail") {
		t.Errorf("doctor with a broken config: err %v, output %q", err, out)
	}

	// As root, a model user that does not exist fails the check: serve
	// would refuse to start.
	t.Run("a missing model user fails", func(t *testing.T) {
		testenv.NeedRoot(t, "inferd checks replica.user only as root")
		_, noUser := newDaemonDir(t, "replica:\n  user: no-such-inferd-user\n")
		out, err := runCLI(noUser, "doctor")
		if err == nil || !strings.Contains(out, "fail  model user") || !strings.Contains(out, "no-such-inferd-user") {
			t.Errorf("doctor with a missing replica.user: err %v, output:\n%s", err, out)
		}
	})
}
