package e2e

// A throwaway root for the .deb install test: the package is installed,
// served and purged by a copy of this test binary in a mount namespace of
// its own, where /etc, /usr and /var are overlays whose changes go to a tmpfs.
// dpkg, the inferd user the package creates, its files and data land there
// and vanish with the namespace: the host keeps no package, user or service,
// and the host's package manager (another apt run, holding its lock) is
// neither waited for nor disturbed. A chroot built with debootstrap would do
// the same at minutes of cost; the overlays cost milliseconds.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// The environment of the copy that runs in the throwaway root: the .deb it
// installs, and the host directory whose tmpfs holds the overlays' upper
// layers. Set only in that copy.
const (
	throwawayDebEnv     = "INFERD_PKGTEST_DEB"
	throwawayScratchEnv = "INFERD_PKGTEST_SCRATCH"
)

// throwawayDirs are the trees a package install writes: dpkg's database and
// the package's data (/var), its files and unit (/usr), its config, user
// and enabled unit (/etc). /bin, /lib and /sbin are /usr's on Debian.
var throwawayDirs = []string{"/etc", "/usr", "/var"}

// throwawayLimit bounds the copy's run: a hung dpkg or daemon ends it, with
// everything it started, instead of the whole e2e package.
const throwawayLimit = 8 * time.Minute

// inThrowawayRoot reports whether this process is the copy that runs in the
// throwaway root, and returns the .deb it is to install.
func inThrowawayRoot() (deb string, ok bool) {
	deb = os.Getenv(throwawayDebEnv)
	return deb, deb != ""
}

// runInThrowawayRoot runs test t again, in a copy of this test binary in a
// mount namespace of its own (see enterThrowawayRoot), with deb to install,
// and fails t with the copy's output when it fails. Afterwards it checks
// that the host has none of what the package installs that it lacked before.
func runInThrowawayRoot(t *testing.T, deb string) {
	t.Helper()
	before := hostPackageTraces()
	ctx, cancel := context.WithTimeout(context.Background(), throwawayLimit)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+t.Name()+"$", "-test.v", "-test.count=1",
		"-test.timeout="+throwawayLimit.String())
	cmd.Dir = "e2e" // TestMain steps up to the module root, as for this process
	// Not t.TempDir: as root that is under /var (testenv.ShareTempDirWithModels),
	// which the copy overlays, and an overlay's upper layer may not sit in
	// its lower one.
	scratch, err := os.MkdirTemp("/tmp", "inferd-pkgtest-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scratch) })
	cmd.Env = append(os.Environ(), throwawayDebEnv+"="+deb, throwawayScratchEnv+"="+scratch)
	// A mount namespace of its own, made private (os/exec remounts / with
	// MS_PRIVATE for CLONE_NEWNS), in a process group of its own so that a
	// timeout kills the daemon and models it started too.
	cmd.SysProcAttr = &syscall.SysProcAttr{Unshareflags: syscall.CLONE_NEWNS, Setpgid: true}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = 10 * time.Second
	out, err := cmd.CombinedOutput()
	switch {
	case ctx.Err() != nil:
		t.Errorf("the package test did not finish within %s in its throwaway root; its output:\n%s", throwawayLimit, out)
	case err != nil:
		t.Errorf("the package test failed in its throwaway root (%v):\n%s", err, out)
	case strings.Contains(string(out), "--- SKIP"):
		t.Skipf("skipped in its throwaway root:\n%s", out)
	default:
		t.Logf("in its throwaway root:\n%s", out)
	}
	for _, trace := range hostPackageTraces() {
		if !strings.Contains(strings.Join(before, "\n"), trace) {
			t.Errorf("the package test left %s on the host", trace)
		}
	}
}

// hostPackageTraces lists what of the package is on this machine: its
// dpkg record, its user, its files.
func hostPackageTraces() []string {
	var out []string
	if st, _ := exec.Command("dpkg-query", "-W", "-f=${Status}", "inferd").Output(); len(st) > 0 && !strings.Contains(string(st), "not-installed") {
		out = append(out, "an installed inferd package ("+string(st)+")")
	}
	if _, err := user.Lookup("inferd"); err == nil {
		out = append(out, "the inferd user")
	}
	for _, path := range []string{pkgBinary, pkgUnit, pkgWants, "/etc/inferd", pkgDataDir} {
		if _, err := os.Lstat(path); err == nil {
			out = append(out, path)
		}
	}
	return out
}

// enterThrowawayRoot lays overlays over throwawayDirs in this process's
// mount namespace (the copy's own), their upper layers on a tmpfs over the
// scratch directory; it ends t unless it is the copy.
func enterThrowawayRoot(t *testing.T) {
	t.Helper()
	scratch := os.Getenv(throwawayScratchEnv)
	if scratch == "" {
		t.Fatalf("%s is not set: the throwaway root is made by runInThrowawayRoot", throwawayScratchEnv)
	}
	// Nothing mounted here reaches the host's namespace.
	if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
		t.Fatalf("make / private in the throwaway root's namespace: %v", err)
	}
	if err := unix.Mount("tmpfs", scratch, "tmpfs", 0, "mode=0700"); err != nil {
		t.Fatalf("tmpfs for the throwaway root: %v", err)
	}
	for _, dir := range throwawayDirs {
		upper, work := filepath.Join(scratch, "upper", dir), filepath.Join(scratch, "work", dir)
		for _, d := range []string{upper, work} {
			if err := os.MkdirAll(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", dir, upper, work)
		if err := unix.Mount("overlay", dir, "overlay", 0, opts); err != nil {
			t.Fatalf("overlay over %s for the throwaway root: %v (overlayfs is needed: modprobe overlay)", dir, err)
		}
	}
}
