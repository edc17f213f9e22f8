package e2e

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"inferd/internal/testenv"
)

// TestAFullDiskRefusesCallsAndReportsNoneStored runs the daemon with its
// data directory on a small tmpfs and fills the tmpfs: a start whose commit
// cannot be written is answered "storage full" with no callID (the caller
// holds nothing it could check, and nothing runs, nor is listed); once
// there is room again, calls are taken as before. (A small write may still
// fit in pages the data file has freed: the large call needs new ones.)
func TestAFullDiskRefusesCallsAndReportsNoneStored(t *testing.T) {
	testenv.NeedRoot(t, "the data directory is a tmpfs the test mounts")
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: 20s\n")
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=32m,mode=0700", "tmpfs", data).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs: %v\n%s", err, out)
	}
	// Registered first, so it runs after the daemon's own cleanup stops it.
	t.Cleanup(func() {
		if out, err := exec.Command("umount", data).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v\n%s", data, err, out)
		}
	})
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, marker(), ""))
	c := inferenceClient{t: t, base: d.base, key: key}
	if r := c.start("mk-echo", `{"n": 1}`, false); r["message"] != "success" {
		t.Fatalf("a call before the disk fills: %v", r)
	}

	ballast := fillDisk(t, data)
	big := `{"pad": "` + strings.Repeat("x", 1<<20) + `"}` // new pages: none free to reuse
	r := c.start("mk-echo", big, true)
	if r["message"] != "error: storage full; the call was not accepted" || r["callID"] != "" {
		t.Fatalf("a start on a full disk: message %q callID %q; want storage full and no callID", r["message"], r["callID"])
	}

	if err := os.Remove(ballast); err != nil {
		t.Fatal(err)
	}
	if r := c.start("mk-echo", big, false); r["message"] != "success" {
		t.Errorf("a call once there is room again: %v", r["message"])
	}
	_, calls := do(t, "GET", d.base+"/v1/status/calls", map[string]string{"X-Service-API-Key": key}, "")
	if n := len(calls["results"].([]any)); n != 2 {
		t.Errorf("the status lists %d calls, want the 2 taken (none for the refused start)", n)
	}
}

// fillDisk writes a file in dir until the file system has no room left, and
// returns its path.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "ballast")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 64<<10)
	for {
		if _, err := f.Write(chunk); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatalf("fill %s: %v", dir, err)
			}
			return path
		}
	}
}
