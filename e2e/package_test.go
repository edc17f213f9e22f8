package e2e

// The .deb install test: build the package with `scripts/package.sh` (what
// `make package` runs) and check it with lintian, then, in a throwaway root
// (throwaway_test.go: overlays in a mount namespace of its own, never the
// host), install it with dpkg, start inferd the way the installed systemd
// unit would (CI has no systemd), administer and call it as the docs say,
// and remove and purge the package.

import (
	"bytes"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"inferd/internal/testenv"
)

const (
	pkgUnit    = "/usr/lib/systemd/system/inferd.service"
	pkgConfig  = "/etc/inferd/config.yaml"
	pkgDataDir = "/var/lib/inferd"
	pkgBinary  = "/usr/bin/inferd"
	pkgWants   = "/etc/systemd/system/multi-user.target.wants/inferd.service"
)

func TestDebPackageInstallsServesAndPurges(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t, "the .deb install test mounts its throwaway root (a mount namespace of its own)")
	if _, err := exec.LookPath("dpkg"); err != nil {
		testenv.Missing(t, "dpkg, to install the .deb")
	}
	echoDir(t) // the packaged example needs python3
	deb, inRoot := inThrowawayRoot()
	if !inRoot {
		deb, _ = packaged(t)
		if out, _ := exec.Command("dpkg-deb", "-f", deb, "Homepage").Output(); strings.TrimSpace(string(out)) != "" {
			t.Errorf("the .deb names a Homepage, %q, though no PKG_HOMEPAGE was set", out)
		}
		// lintian reads the .deb while the copy installs it: neither
		// waits for the other.
		linted := lintianCheck(t, deb)
		defer func() { <-linted }() // before t ends, whichever way
		runInThrowawayRoot(t, deb)
		return
	}
	enterThrowawayRoot(t)
	// man-db's dpkg trigger rebuilds the index of every manual page on the
	// box (minutes on a loaded one); this test reads its page directly.
	// Debian's man-db skips that without this file.
	if err := os.Remove("/var/lib/man-db/auto-update"); err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	// An inferd package or data the host had is the throwaway root's to
	// drop: this test installs its own.
	if out, _ := exec.Command("dpkg-query", "-W", "-f=${Status}", "inferd").Output(); len(out) > 0 && !strings.Contains(string(out), "not-installed") {
		dpkgRun(t, "--purge", "inferd")
	}
	if err := os.RemoveAll(pkgDataDir); err != nil {
		t.Fatal(err)
	}
	dpkgRun(t, "-i", deb)

	// What the package put on the box.
	pkgVersion := strings.TrimSpace(mustOutput(t, exec.Command("dpkg-query", "-W", "-f=${Version}", "inferd")))
	if out := mustOutput(t, exec.Command(pkgBinary, "version")); !strings.Contains(out, "inferd "+pkgVersion+" (commit ") ||
		strings.Contains(out, "commit unknown") || strings.Contains(out, "built unknown") {
		t.Errorf("%s version = %q, want version %s, a commit and a build date", pkgBinary, out, pkgVersion)
	}
	if conf := mustOutput(t, exec.Command("dpkg-query", "-W", "-f=${Conffiles}", "inferd")); !strings.Contains(conf, pkgConfig) {
		t.Errorf("%s is not a conffile (dpkg would overwrite the operator's edits on upgrade); conffiles: %q", pkgConfig, conf)
	}
	example, err := os.ReadFile("config.example.yaml")
	if err != nil {
		t.Fatal(err)
	}
	wantConfig := strings.Replace(string(example), "\ndataDir: ./data\n", "\ndataDir: "+pkgDataDir+"\n", 1)
	if got, err := os.ReadFile(pkgConfig); err != nil || string(got) != wantConfig {
		t.Errorf("%s should be config.example.yaml with dataDir: %s (err %v); got:\n%s", pkgConfig, pkgDataDir, err, got)
	}
	// Enabled for systemd even with none running (an image built in a
	// chroot starts inferd at its first boot).
	// (deb-systemd-helper may link through /lib, which is /usr/lib here.)
	wants, err := filepath.EvalSymlinks(pkgWants)
	if unit, _ := filepath.EvalSymlinks(pkgUnit); err != nil || wants != unit {
		t.Errorf("%s resolves to %q (%v), want %s: the package enables the unit", pkgWants, wants, err, unit)
	}

	// The manual page is the CLI's own help, `inferd help` and each
	// command's: every line of them is there but the first (the NAME) and
	// the section headers ("Usage:", "Global flags:").
	manPage := readGzip(t, "/usr/share/man/man1/inferd.1.gz")
	manPage = strings.NewReplacer(`\-`, "-", `\e`, `\`, `\&`, "").Replace(manPage)
	global := mustOutput(t, exec.Command(pkgBinary, "help"))
	helps := map[string]string{"": global}
	for _, m := range regexp.MustCompile(`(?m)^  inferd \[global flags\] ([a-z][a-z-]*)`).FindAllStringSubmatch(global, -1) {
		helps[m[1]] = mustOutput(t, exec.Command(pkgBinary, "help", m[1]))
	}
	if len(helps) < 5 {
		t.Fatalf("found only %d commands in `inferd help`:\n%s", len(helps)-1, global)
	}
	header := regexp.MustCompile(`^[A-Z][a-z]*( [a-z]+)?( [a-z]+)?:$`)
	for cmd, help := range helps {
		lines := strings.Split(help, "\n")
		if cmd == "" {
			lines = lines[1:]
		}
		for _, line := range lines {
			if line = strings.TrimSpace(line); line != "" && !header.MatchString(line) && !strings.Contains(manPage, line) {
				t.Errorf("the man page lacks this line of `inferd help %s`: %q", cmd, line)
			}
		}
	}
	if got, want := readFile(t, pkgUnit), readFile(t, "packaging/inferd.service"); got != want {
		t.Errorf("%s differs from packaging/inferd.service", pkgUnit)
	}
	unit := parseUnit(t, readFile(t, pkgUnit))
	svc, err := user.Lookup(unit.user)
	if err != nil {
		t.Fatalf("the unit runs as %q, which the package did not create: %v", unit.user, err)
	}
	uid, _ := strconv.Atoi(svc.Uid)
	gid, _ := strconv.Atoi(svc.Gid)
	if fi, err := os.Stat(pkgDataDir); err != nil {
		t.Fatalf("the package did not create %s: %v", pkgDataDir, err)
	} else if st := fi.Sys().(*syscall.Stat_t); int(st.Uid) != uid || fi.Mode().Perm() != 0o700 {
		t.Errorf("%s: owner uid %d mode %o, want uid %d (%s) mode 700", pkgDataDir, st.Uid, fi.Mode().Perm(), uid, unit.user)
	}

	// Start inferd as the unit would: its ExecStart, User, capabilities,
	// delegated cgroup, Environment and systemd's default environment, from
	// /. Only the port differs: the packaged 127.0.0.1:8080 may be taken on
	// a shared CI box.
	port := freePort(t)
	cmd := exec.Command(unit.execStart[0], unit.execStart[1:]...)
	cmd.Dir = "/"
	cmd.Env = append([]string{
		"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin",
		"HOME=" + svc.HomeDir, "USER=" + svc.Username, "LOGNAME=" + svc.Username,
	}, unit.environment...)
	cmd.Env = append(cmd.Env, fmt.Sprintf("INFERD_LISTEN=127.0.0.1:%d", port))
	d := startDaemonCmd(t, asUnit(t, unit, uid, gid, cmd), pkgDataDir, pkgConfig)
	if d.base != fmt.Sprintf("http://127.0.0.1:%d", port) {
		t.Errorf("inferd serves on %s, want port %d", d.base, port)
	}

	// Administer it as the docs say: `sudo -u inferd inferd --config ... CMD`.
	asService := func(args ...string) string {
		t.Helper()
		c := exec.Command(pkgBinary, append([]string{"--config", pkgConfig}, args...)...)
		c.Dir = "/"
		c.Env = []string{"PATH=/usr/sbin:/usr/bin", "HOME=" + svc.HomeDir, fmt.Sprintf("INFERD_LISTEN=127.0.0.1:%d", port)}
		c.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
		return mustOutput(t, c)
	}
	lines := strings.Split(strings.TrimSpace(asService("key", "create", "--team", "demo")), "\n")
	secret := lines[len(lines)-1]
	asService("apply", "-f", "/usr/share/inferd/examples/projects.yaml")
	body := fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo-1","modelInputs":{"prompt":"hi"}}`, secret)
	status, r := do(t, "POST", d.base+"/start/v4", nil, body)
	if status != 200 || r["message"] != "success" {
		t.Fatalf("start/v4 on the packaged example: HTTP %d %v", status, r)
	}
	out := output(t, r)
	if out["echo"].(map[string]any)["prompt"] != "hi" || out["greeting"] != "hello from inferd" {
		t.Errorf("packaged echo answered %v", out)
	}
	checkServiceSandbox(t, d, secret, out)
	if fi, err := os.Stat(filepath.Join(pkgDataDir, "inferd.db")); err != nil || int(fi.Sys().(*syscall.Stat_t).Uid) != uid {
		t.Errorf("the data file should be %s/inferd.db owned by %s: %v", pkgDataDir, unit.user, err)
	}
	model := modelPid(t, d, out)
	d.stop()
	eventually(t, 30*time.Second, "no process of user "+unit.user+" left", func() bool { return len(processesOfUser(uid)) == 0 })
	if !processGone(model) {
		t.Errorf("the model (pid %d) outlived the service", model)
	}

	// doctor, as the service runs (its user and capabilities), passes on the
	// installed layout, reports the sandbox on, and boots the packaged
	// example model in it.
	doctor := exec.Command(pkgBinary, "--config", pkgConfig, "doctor")
	doctor.Dir = "/"
	doctor.Env = []string{"PATH=/usr/sbin:/usr/bin", "HOME=" + svc.HomeDir, fmt.Sprintf("INFERD_LISTEN=127.0.0.1:%d", port)}
	unit.delegate = false // doctor runs from a shell, in no delegated cgroup
	report := mustOutput(t, asUnit(t, unit, uid, gid, doctor))
	for _, want := range []string{"ok    data dir     " + pkgDataDir, "ok    data file    " + pkgDataDir + "/inferd.db opens",
		"ok    model user   a uid per project", "ok    network", "ok    private dirs",
		"ok    pid ns", "ok    private tmp", "ok    user ns", "ok    file modes",
		"ok    example      /usr/share/inferd/examples/echo boots"} {
		if !strings.Contains(report, want) {
			t.Errorf("doctor on the installed package lacks %q:\n%s", want, report)
		}
	}

	// Remove keeps the config and the data; purge deletes both.
	dpkgRun(t, "-r", "inferd")
	for path, want := range map[string]bool{pkgBinary: false, pkgUnit: false, pkgConfig: true, filepath.Join(pkgDataDir, "inferd.db"): true} {
		if _, err := os.Stat(path); (err == nil) != want {
			t.Errorf("after dpkg -r: %s exists = %v, want %v", path, err == nil, want)
		}
	}
	dpkgRun(t, "--purge", "inferd")
	for _, path := range []string{"/etc/inferd", pkgDataDir, pkgWants} {
		if _, err := os.Lstat(path); err == nil {
			t.Errorf("after dpkg --purge: %s still exists", path)
		}
	}
	if _, err := user.Lookup(unit.user); err != nil {
		t.Errorf("purge removed the %s user (Debian keeps system users so their uid is never reused): %v", unit.user, err)
	}
}

// modelPid is the pid, as the host numbers it, of d's echo model that
// answered out: the pid it reports is of its own PID namespace, and its
// replica id may be another daemon's too (another package test on the box).
func modelPid(t *testing.T, d *daemon, out map[string]any) int {
	t.Helper()
	var mine []int
	for _, pid := range processesWithEnvVar("INFERD_REPLICA_ID", fmt.Sprint(out["replica"])) {
		if descendsFrom(pid, d.cmd.Process.Pid) {
			mine = append(mine, pid)
		}
	}
	if len(mine) != 1 {
		t.Fatalf("processes of replica %v under the daemon: %v, want the model alone", out["replica"], mine)
	}
	return mine[0]
}

// descendsFrom reports whether ancestor is pid's parent, or its parent's...
func descendsFrom(pid, ancestor int) bool {
	for pid > 1 {
		stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		i := bytes.LastIndexByte(stat, ')')
		if err != nil || i < 0 {
			return false
		}
		f := strings.Fields(string(stat[i+1:]))
		if len(f) < 2 {
			return false
		}
		if pid, _ = strconv.Atoi(f[1]); pid == ancestor {
			return true
		}
	}
	return false
}

// checkServiceSandbox shows that the service, as the unit runs it (its user,
// capabilities and delegated cgroup, not root), puts replicas in their box:
// /v1/status reports each protection on (memory and pids limits where the
// host has those controllers in cgroup v2: a v1 one is not delegated), and
// the packaged model (echoed in out) runs under a uid of its own, with no
// capability and no way to gain one.
func checkServiceSandbox(t *testing.T, d *daemon, key string, out map[string]any) {
	t.Helper()
	status, body := doRaw(t, "GET", d.base+"/v1/status", map[string]string{"X-Service-API-Key": key}, "")
	var st struct {
		Protections []struct {
			Name   string `json:"name"`
			On     bool   `json:"on"`
			Detail string `json:"detail"`
		} `json:"protections"`
	}
	if err := json.Unmarshal(body, &st); status != 200 || err != nil || len(st.Protections) != 11 {
		t.Fatalf("GET /v1/status: %d %v %s", status, err, body)
	}
	for _, p := range st.Protections {
		// A host that mounts memory or pids only as cgroup v1 (as CI machines
		// here do) delegates neither to a service: there, not root, the limit
		// is off, and says why.
		v1Only := (p.Name == "memoryLimit" || p.Name == "pidsLimit") && strings.Contains(p.Detail, "only as cgroup v1")
		if !p.On && !v1Only {
			t.Errorf("under the unit, protection %s is off: %s", p.Name, p.Detail)
		}
	}
	pid := modelPid(t, d, out)
	procStatus, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	fields := map[string]string{}
	for _, line := range strings.Split(string(procStatus), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok {
			fields[k] = strings.TrimSpace(v)
		}
	}
	uid, _ := strconv.Atoi(strings.Fields(fields["Uid"])[0])
	if uid < 61184 || uid > 65519 {
		t.Errorf("the model runs as uid %d, want one of replica.uidRange 61184-65519", uid)
	}
	for _, k := range []string{"CapInh", "CapPrm", "CapEff", "CapAmb"} {
		if fields[k] != "0000000000000000" {
			t.Errorf("the model has %s %s: the service's capabilities reached it", k, fields[k])
		}
	}
	if fields["NoNewPrivs"] != "1" {
		t.Errorf("the model's NoNewPrivs is %q, want 1", fields["NoNewPrivs"])
	}
}

// packagedBuild is scripts/package.sh's output, made once per test run
// beside inferdBin: the .deb the package test installs and the production
// binary packed in it, which the payload tests measure.
var packagedBuild struct {
	once        sync.Once
	deb, binary string
	err         error
}

// packaged runs scripts/package.sh (what make package runs) once and
// returns the .deb and the binary it packed.
func packaged(t *testing.T) (deb, binary string) {
	t.Helper()
	b := &packagedBuild
	b.once.Do(buildPackaged)
	if b.err != nil {
		t.Fatal(b.err)
	}
	return b.deb, b.binary
}

// buildPackaged fills packagedBuild; TestMain may start it early.
func buildPackaged() {
	b := &packagedBuild
	out := filepath.Join(filepath.Dir(inferdBin), "dist")
	cmd := exec.Command("scripts/package.sh", out)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	stdout, err := cmd.Output()
	if err != nil {
		b.err = fmt.Errorf("scripts/package.sh: %v\n%s%s", err, stdout, stderr.String())
		return
	}
	for _, line := range strings.Split(string(stdout), "\n") {
		if strings.HasSuffix(line, ".deb") {
			b.deb = line
		}
	}
	b.binary = filepath.Join(out, "stage", "inferd") // package.sh's PKG_DIR
	if b.deb == "" {
		b.err = fmt.Errorf("scripts/package.sh printed no .deb:\n%s", stdout)
	} else if _, err := os.Stat(b.binary); err != nil {
		b.err = fmt.Errorf("scripts/package.sh left no binary in its stage dir: %w", err)
	}
}

// lintianLimit bounds lintian's run (about 25 s on a loaded 2-core box).
const lintianLimit = 5 * time.Minute

// lintianCheck runs lintian (Debian's package checker, which
// scripts/test-deps.sh installs) on deb in the background and fails t on
// any error or warning; informational tags are logged, not failed. The
// returned channel closes when it is done.
func lintianCheck(t *testing.T, deb string) <-chan struct{} {
	t.Helper()
	lintian, err := exec.LookPath("lintian")
	if err != nil {
		testenv.Missing(t, "lintian (Debian package lintian; make test installs it)")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		ctx, cancel := context.WithTimeout(context.Background(), lintianLimit)
		defer cancel()
		out, err := exec.CommandContext(ctx, lintian, "--fail-on", "error,warning", "--display-info", deb).CombinedOutput()
		switch {
		case ctx.Err() != nil:
			t.Errorf("lintian %s did not finish within %s:\n%s", filepath.Base(deb), lintianLimit, out)
		case err != nil:
			t.Errorf("lintian %s: %v\n%s", filepath.Base(deb), err, out)
		case len(out) > 0:
			t.Logf("lintian (informational only):\n%s", out)
		}
	}()
	return done
}

func readGzip(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	b, err := io.ReadAll(zr)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return string(b)
}

// dpkgLimit bounds one dpkg run: in the throwaway root no other package
// manager holds its lock, so only a hung maintainer script could take long
// (an install takes seconds: its slow man-db trigger is off).
const dpkgLimit = 5 * time.Minute

// dpkgRun runs dpkg, failing t when it fails or takes over dpkgLimit.
func dpkgRun(t *testing.T, args ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), dpkgLimit)
	defer cancel()
	out, err := exec.CommandContext(ctx, "dpkg", args...).CombinedOutput()
	switch {
	case ctx.Err() != nil:
		t.Fatalf("dpkg %s did not finish within %s:\n%s", strings.Join(args, " "), dpkgLimit, out)
	case err != nil:
		t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, out)
	}
}

type unitFile struct {
	user        string
	environment []string
	execStart   []string
	ambientCaps []string // AmbientCapabilities=, e.g. CAP_KILL
	boundingSet []string // CapabilityBoundingSet=
	noNewPrivs  bool     // NoNewPrivileges=yes
	delegate    bool     // Delegate=yes
}

// parseUnit reads the [Service] settings the test needs. It handles what our
// unit uses (one ExecStart without quoting); anything fancier fails loudly.
func parseUnit(t *testing.T, text string) unitFile {
	t.Helper()
	var u unitFile
	section := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") || strings.HasPrefix(line, ";") {
			continue
		}
		if strings.HasPrefix(line, "[") {
			section = line
			continue
		}
		key, val, _ := strings.Cut(line, "=")
		if section != "[Service]" {
			continue
		}
		switch key {
		case "User":
			u.user = val
		case "Environment":
			if strings.ContainsAny(val, `"'`) {
				t.Fatalf("unit Environment=%s uses quoting, which this test does not parse", val)
			}
			u.environment = append(u.environment, strings.Fields(val)...)
		case "ExecStart":
			if strings.ContainsAny(val, `"'$%`) || u.execStart != nil {
				t.Fatalf("unit ExecStart=%s: quoting, specifiers or several ExecStart lines are not parsed by this test", val)
			}
			u.execStart = strings.Fields(strings.TrimLeft(val, "-@:+!"))
		case "AmbientCapabilities":
			u.ambientCaps = append(u.ambientCaps, strings.Fields(val)...)
		case "CapabilityBoundingSet":
			if strings.HasPrefix(val, "~") {
				t.Fatalf("unit CapabilityBoundingSet=%s: an inverted set is not parsed by this test", val)
			}
			u.boundingSet = append(u.boundingSet, strings.Fields(val)...)
		case "NoNewPrivileges":
			u.noNewPrivs = val == "yes" || val == "true"
		case "Delegate":
			u.delegate = val == "yes" || val == "true"
		}
	}
	if u.user == "" || len(u.execStart) == 0 {
		t.Fatalf("unit has no User= or ExecStart= in [Service]:\n%s", text)
	}
	return u
}

// asUnit returns cmd changed to start as the unit would start it: as its
// user (and that user's groups), with its capabilities (ambient, bounding
// set) and no_new_privs, through setpriv(1). With Delegate=yes it starts in
// a cgroup of the cgroup v2 hierarchy handed to that user the way systemd
// hands one over (the directory and its cgroup.procs, cgroup.subtree_control
// and cgroup.threads chowned to the user); the cgroup is removed when the
// test ends. CI has no systemd to do either.
func asUnit(t *testing.T, u unitFile, uid, gid int, cmd *exec.Cmd) *exec.Cmd {
	t.Helper()
	setpriv, err := exec.LookPath("setpriv")
	if err != nil {
		testenv.Missing(t, "setpriv (util-linux), to start inferd with the unit's user and capabilities")
	}
	caps := func(list []string) string {
		out := []string{"-all"}
		for _, c := range list {
			out = append(out, "+"+strings.ToLower(strings.TrimPrefix(c, "CAP_")))
		}
		return strings.Join(out, ",")
	}
	args := []string{"--reuid", strconv.Itoa(uid), "--regid", strconv.Itoa(gid), "--init-groups",
		"--inh-caps", caps(u.ambientCaps), "--ambient-caps", caps(u.ambientCaps), "--bounding-set", caps(u.boundingSet)}
	if u.noNewPrivs {
		args = append(args, "--no-new-privs")
	}
	wrapped := exec.Command(setpriv, append(append(args, "--"), cmd.Args...)...)
	wrapped.Dir, wrapped.Env, wrapped.Stdout, wrapped.Stderr = cmd.Dir, cmd.Env, cmd.Stdout, cmd.Stderr
	if u.delegate {
		dir := delegatedCgroup(t, uid, gid)
		fd, err := syscall.Open(dir, syscall.O_DIRECTORY|syscall.O_CLOEXEC, 0)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { syscall.Close(fd) })
		wrapped.SysProcAttr = &syscall.SysProcAttr{UseCgroupFD: true, CgroupFD: fd}
	}
	return wrapped
}

// delegatedCgroup makes a cgroup v2 for the service user, as Delegate=yes
// does, and removes it (and what inferd made in it) when the test ends.
func delegatedCgroup(t *testing.T, uid, gid int) string {
	t.Helper()
	mount := ""
	info, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(info), "\n") {
		if pre, post, ok := strings.Cut(line, " - "); ok && strings.HasPrefix(post, "cgroup2 ") {
			if f := strings.Fields(pre); len(f) >= 5 {
				mount = f[4]
				break
			}
		}
	}
	if mount == "" {
		testenv.Missing(t, "a cgroup v2 hierarchy, to delegate a cgroup to the service as Delegate=yes does")
	}
	dir := filepath.Join(mount, "inferd-pkgtest-"+marker())
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"", "cgroup.procs", "cgroup.subtree_control", "cgroup.threads"} {
		if err := os.Chown(filepath.Join(dir, f), uid, gid); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Deepest first; each must be empty by now.
		var dirs []string
		filepath.WalkDir(dir, func(path string, e os.DirEntry, err error) error {
			if err == nil && e.IsDir() {
				dirs = append(dirs, path)
			}
			return nil
		})
		for i := len(dirs) - 1; i >= 0; i-- {
			if err := syscall.Rmdir(dirs[i]); err != nil {
				t.Errorf("remove the delegated cgroup %s: %v", dirs[i], err)
			}
		}
	})
	return dir
}

// processesOfUser lists the live pids whose real uid is uid.
func processesOfUser(uid int) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		status, err := os.ReadFile(filepath.Join("/proc", e.Name(), "status"))
		if err != nil || bytes.Contains(status, []byte("\nState:\tZ")) {
			continue
		}
		for _, line := range strings.Split(string(status), "\n") {
			if f := strings.Fields(line); len(f) > 1 && f[0] == "Uid:" && f[1] == strconv.Itoa(uid) {
				pids = append(pids, pid)
			}
		}
	}
	return pids
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func mustOutput(t *testing.T, cmd *exec.Cmd) string {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, stderr.String())
	}
	return string(out)
}
