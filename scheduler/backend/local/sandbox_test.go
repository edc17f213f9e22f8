package local

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/scheduler/backend"
	"inferd/store"
)

// needRoot ends a test that needs root to build the sandbox it checks.
func needRoot(t *testing.T) {
	t.Helper()
	testenv.NeedRoot(t, "the sandbox needs it to switch users and make cgroups and network namespaces")
}

// needPython returns the python3 interpreter, or ends the test without one.
func needPython(t *testing.T) string {
	t.Helper()
	py, err := python()
	if err != nil {
		testenv.Missing(t, "python3 on PATH: %v", err)
	}
	return py
}

// perProject configures a test backend with a uid per project, recorded in the
// test's run dir.
func perProject(c *Config) {
	c.User = PerProject
	c.UIDFile = filepath.Join(c.RunDir, "uids.json")
}

// sandboxSpec is a shell model of project id, in a directory any user can read.
func sandboxSpec(id, script string) backend.Spec {
	s := shSpec(id, script)
	s.Model.Dir = "/"
	return s
}

// logText is what p's model has written so far.
func logText(t *testing.T, b *Backend, p *Process) string {
	t.Helper()
	data, err := os.ReadFile(b.logPath(p.spec))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	return string(data)
}

// waitLog waits until p's log holds want, and returns the log.
func waitLog(t *testing.T, b *Backend, p *Process, want string) string {
	t.Helper()
	var text string
	waitFor(t, fmt.Sprintf("%q in the model's log", want), func() bool {
		text = logText(t, b, p)
		return strings.Contains(text, want) || closed(p.Exited())
	})
	if !strings.Contains(text, want) {
		t.Fatalf("the model exited (%v) without writing %q; log:\n%s", p.ExitErr(), want, text)
	}
	return text
}

// field returns the value after "name=" in a line of the model's output.
func field(text, name string) string {
	for _, f := range strings.Fields(text) {
		if v, ok := strings.CutPrefix(f, name+"="); ok {
			return v
		}
	}
	return ""
}

// whoamiScript prints what the sandbox gave the model, then waits.
const whoamiScript = `echo "uid=$(id -u) gid=$(id -g) groups=$(id -G | tr ' ' ,) home=$HOME tmp=$TMPDIR user=$USER" \
  "nnp=$(awk '/^NoNewPrivs/{print $2}' /proc/self/status) capeff=$(awk '/^CapEff/{print $2}' /proc/self/status)" \
  "capamb=$(awk '/^CapAmb/{print $2}' /proc/self/status)"; echo done; exec sleep 1000`

func TestEachProjectRunsUnderAUIDOfItsOwnKeptForGood(t *testing.T) {
	needRoot(t)
	b := testBackendWith(t, perProject)
	seen := map[string]string{} // project → uid
	for _, id := range []string{"a", "b"} {
		p := startModel(t, b, sandboxSpec("who-"+id, whoamiScript))
		out := waitLog(t, b, p, "done")
		uid, _ := strconv.Atoi(field(out, "uid"))
		if uid < DefaultUIDFirst || uid > DefaultUIDLast || field(out, "gid") != strconv.Itoa(uid) || field(out, "groups") != strconv.Itoa(uid) {
			t.Fatalf("project %s: %s; want a uid of the range, its own gid and no other group", id, out)
		}
		if field(out, "user") != strconv.Itoa(uid) {
			t.Errorf("USER = %q, want the uid", field(out, "user"))
		}
		// No capability and no way to gain one, whatever the daemon holds.
		if field(out, "nnp") != "1" || field(out, "capeff") != "0000000000000000" || field(out, "capamb") != "0000000000000000" {
			t.Errorf("project %s: no_new_privs %s, effective caps %s, ambient %s; want 1 and none", id, field(out, "nnp"), field(out, "capeff"), field(out, "capamb"))
		}
		seen[p.spec.ProjectID] = field(out, "uid")
	}
	if seen["proj-who-a"] == seen["proj-who-b"] {
		t.Fatalf("two projects share uid %s", seen["proj-who-a"])
	}

	// A restarted daemon (a new backend on the same data) gives each project
	// the uid it had, and a new project another one.
	next := testBackendWith(t, func(c *Config) {
		perProject(c)
		c.RunDir, c.UIDFile = b.cfg.RunDir, b.cfg.UIDFile
	})
	for project, uid := range seen {
		got, err := next.sb.uids.uid("team", project)
		if err != nil || strconv.Itoa(int(got)) != uid {
			t.Errorf("after a restart project %s runs as %d (%v), want %s", project, got, err, uid)
		}
	}
	if got, _ := next.sb.uids.uid("team", "proj-new"); slices.Contains([]string{seen["proj-who-a"], seen["proj-who-b"]}, strconv.Itoa(int(got))) {
		t.Errorf("a new project got uid %d, which another project has", got)
	}
}

func TestUIDTable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "uids.json")
	tab, err := openUIDTable(path, 70000, 70002)
	if err != nil {
		t.Fatal(err)
	}
	got := map[uint32]string{}
	for _, key := range [][2]string{{"t1", "p"}, {"t2", "p"}, {"t1", "q"}} {
		uid, err := tab.uid(key[0], key[1])
		if err != nil {
			t.Fatal(err)
		}
		if prev, dup := got[uid]; dup {
			t.Fatalf("uid %d given to %s and %v", uid, prev, key)
		}
		got[uid] = key[0] + "/" + key[1]
		if again, _ := tab.uid(key[0], key[1]); again != uid {
			t.Errorf("%v: uid %d, then %d", key, uid, again)
		}
	}
	// The same id for another team is another project: a uid of its own.
	if _, err := tab.uid("t3", "p"); err == nil || !strings.Contains(err.Error(), "used up") {
		t.Fatalf("a fourth project in a range of three: %v", err)
	}

	reopened, err := openUIDTable(path, 70000, 70002)
	if err != nil {
		t.Fatal(err)
	}
	for uid, key := range got {
		team, project, _ := strings.Cut(key, "/")
		if again, err := reopened.uid(team, project); err != nil || again != uid {
			t.Errorf("reopened: %s has uid %d (%v), want %d", key, again, err, uid)
		}
	}

	ro, err := openUIDTable(path, 70000, 70010)
	if err != nil {
		t.Fatal(err)
	}
	ro.readOnly = true
	before, _ := os.ReadFile(path)
	if _, err := ro.uid("t9", "doctor"); err != nil {
		t.Fatal(err)
	}
	if after, _ := os.ReadFile(path); string(after) != string(before) {
		t.Error("a read-only table wrote its file")
	}

	if err := os.WriteFile(path, []byte("{not json"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := openUIDTable(path, 70000, 70002); err == nil || !strings.Contains(err.Error(), "backup") {
		t.Errorf("a corrupt file: %v, want an error saying not to delete it", err)
	}
}

func TestUIDTableSkipsUIDsOfRealUsers(t *testing.T) {
	nobody, err := LookupRunAs("nobody")
	if err != nil {
		testenv.Missing(t, "a user nobody: %v", err)
	}
	tab, _ := openUIDTable("", nobody.UID, nobody.UID+1)
	for range 2 {
		if uid, err := tab.uid("t", "p"); err != nil || uid != nobody.UID+1 {
			t.Fatalf("uid = %d, %v; want %d, past nobody's", uid, err, nobody.UID+1)
		}
	}
}

func TestPrivateDirIsTheReplicasOwnAndGoesWithIt(t *testing.T) {
	needRoot(t)
	b := testBackendWith(t, perProject)
	// The model hides what it writes from everyone, itself included.
	p := startModel(t, b, sandboxSpec("home-1", `mkdir -p "$HOME/a/b" && echo x > "$HOME/a/b/f" && ln -s /etc/passwd "$HOME/link" && \
		chmod 000 "$HOME/a/b" "$HOME/a" && echo ready; exec sleep 1000`))
	waitLog(t, b, p, "ready")
	dir := p.box.dir
	fi, err := os.Stat(dir)
	if err != nil {
		t.Fatal(err)
	}
	if st := fi.Sys().(*syscall.Stat_t); st.Uid != p.box.runAs.UID || fi.Mode().Perm() != 0o700 {
		t.Errorf("private dir: owner %d mode %o, want the model's uid %d, 0700", st.Uid, fi.Mode().Perm(), p.box.runAs.UID)
	}
	if base, _ := os.Stat(filepath.Dir(dir)); base.Mode().Perm() != 0o711 {
		t.Errorf("the private dirs' parent has mode %o, want 0711 (no listing)", base.Mode().Perm())
	}
	p.stop(time.Second)
	if _, err := os.Lstat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("private dir still there after the replica ended: %v", err)
	}
	if _, err := os.Stat("/etc/passwd"); err != nil {
		t.Fatalf("removing the private dir followed the model's link: %v", err)
	}
}

func TestMemoryLimitEndsTheReplicaAsOutOfMemory(t *testing.T) {
	needRoot(t)
	py := needPython(t)
	b := testBackend(t)
	if b.sb.cgroups == nil || (!b.sb.cgroups.v2Ctl["memory"] && b.sb.cgroups.v1["memory"].base == "") {
		testenv.Missing(t, "a memory controller to make cgroups in")
	}
	spec := sandboxSpec("oom-1", "")
	spec.Model.Command = []string{py, "-c", "x = bytearray(400 << 20); print('allocated', flush=True)"}
	spec.Model.MemoryMiB = 64
	p := startModel(t, b, spec)
	waitExited(t, p)
	var oom *backend.OutOfMemoryError
	if !errors.As(p.ExitErr(), &oom) || oom.LimitMiB != 64 {
		t.Fatalf("ExitErr = %v, want out of memory (limit 64 MiB)", p.ExitErr())
	}
	if strings.Contains(logText(t, b, p), "allocated") {
		t.Error("the model got its 400 MiB under a 64 MiB limit")
	}

	// Without a limit the same model runs to its end.
	spec.ReplicaID, spec.Model.MemoryMiB = "oom-2", 0
	p = startModel(t, b, spec)
	waitExited(t, p)
	if err := p.ExitErr(); err != nil {
		t.Fatalf("without a limit: ExitErr = %v", err)
	}
}

func TestPidsLimitCapsTheReplicasProcesses(t *testing.T) {
	needRoot(t)
	py := needPython(t)
	b := testBackend(t)
	cg := b.sb.cgroups
	if cg == nil || (!cg.v2Ctl["pids"] && cg.v1["pids"].base == "") {
		testenv.Missing(t, "a pids controller to make cgroups in")
	}
	spec := sandboxSpec("pids-1", "")
	spec.Model.Command = []string{py, "-c", `import os, time
n = 0
for i in range(12):
    try:
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
        n += 1
    except OSError:
        pass
print("forked", n, flush=True)
time.sleep(1000)
`}
	spec.Model.PidsMax = 5
	p := startModel(t, b, spec)
	waitLog(t, b, p, "forked")
	dir := p.box.cg.v2
	if !cg.v2Ctl["pids"] {
		dir = p.box.cg.v1["pids"]
	}
	pids, err := cgroupPids(dir)
	// The model's own (its init's threads aside, which have their own
	// allowance, and what the init may grow by: box.started).
	pids = slices.DeleteFunc(pids, func(pid int) bool { return pid == p.pid })
	limit := 5
	if p.box.namespaces {
		limit += initSlack
	}
	if err != nil || len(pids) > limit {
		t.Fatalf("%d model processes in the replica's cgroup (%v), want at most pidsMax 5 (and the init's slack, %d)", len(pids), err, limit-5)
	}
}

func TestCgroupsAreRemovedWithTheReplica(t *testing.T) {
	needRoot(t)
	b := testBackend(t)
	if b.sb.cgroups == nil {
		testenv.Missing(t, "a cgroup per replica: %s", b.sb.cgWhy)
	}
	p := startModel(t, b, sandboxSpec("cg-1", "exec sleep 1000"))
	dirs := slices.Collect(func(yield func(string) bool) {
		if p.box.cg.v2 != "" {
			yield(p.box.cg.v2)
		}
		for _, d := range p.box.cg.v1 {
			yield(d)
		}
	})
	for _, d := range dirs {
		if pids, _ := cgroupPids(d); !slices.Contains(pids, p.pid) {
			t.Errorf("the model (pid %d) is not in its cgroup %s: %v", p.pid, d, pids)
		}
	}
	p.stop(time.Second)
	for _, d := range dirs {
		if _, err := os.Stat(d); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("cgroup %s left after the replica ended", d)
		}
	}
}

// A daemon that died left a replica, and a child that left its process group:
// the next daemon's Recover kills the whole cgroup.
func TestRecoverKillsTheCgroupsAPreviousDaemonLeft(t *testing.T) {
	needRoot(t)
	b := testBackend(t)
	if b.sb.cgroups == nil {
		testenv.Missing(t, "a cgroup per replica: %s", b.sb.cgWhy)
	}
	p := startModel(t, b, sandboxSpec("left-1", escapeScript))
	waitFor(t, "the child to start", func() bool { return strings.HasPrefix(p.LastLogLine(), "escaped ") })
	escaped, _ := strconv.Atoi(strings.TrimPrefix(p.LastLogLine(), "escaped "))
	escaped = hostPid(t, p, escaped)
	t.Cleanup(func() { syscall.Kill(escaped, syscall.SIGKILL) })
	// No pid file: only the cgroup knows this replica (the pid file would reach
	// the leader's group, not the child that left it).
	if err := os.Remove(pidFilePath(b.cfg.RunDir, "left-1")); err != nil {
		t.Fatal(err)
	}

	// The next daemon on the same data dir: the same run dir names the same cgroups.
	next, err := New(Config{RunDir: b.cfg.RunDir, User: "root"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(next.Close)
	if err := next.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	waitExited(t, p)
	waitGone(t, escaped)
}

func TestPrivateNetworkReachesNothingOutside(t *testing.T) {
	needRoot(t)
	py := needPython(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	probe := fmt.Sprintf(`import socket
try:
    socket.create_connection(("127.0.0.1", %d), 2).close()
    print("reached=yes", flush=True)
except OSError as e:
    print("reached=no", e, flush=True)
`, ln.Addr().(*net.TCPAddr).Port)
	for _, tc := range []struct {
		name string
		set  func(*Config)
		want string
	}{
		{"private", func(*Config) {}, "no"},
		{"host", hostNetwork, "yes"}, // what network: host allows
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := testBackendWith(t, tc.set)
			spec := sandboxSpec("net-"+tc.name, "")
			spec.Model.Command = []string{py, "-c", probe}
			p := startModel(t, b, spec)
			waitExited(t, p)
			if got := field(logText(t, b, p), "reached"); got != tc.want {
				t.Fatalf("the model reaching a port of the host: %q, want %q; log: %s", got, tc.want, logText(t, b, p))
			}
		})
	}
}

// A project's network: host wins over the daemon's private default.
func TestProjectNetworkHostOptsOut(t *testing.T) {
	needRoot(t)
	b := testBackend(t)
	spec := sandboxSpec("opt-1", "exec sleep 1000")
	spec.Model.Network = store.NetworkHost
	p := startModel(t, b, spec)
	if p.box.private || p.port == modelPort {
		t.Fatalf("network: host: private %v, port %d; want the host's network and a port of its own", p.box.private, p.port)
	}
	if !b.sb.privateNetwork(store.ModelSpec{}) {
		t.Error("the daemon's default is not private any more")
	}
}

func TestProtectionsSayWhatIsOff(t *testing.T) {
	needRoot(t)
	names := func(ps []backend.Protection) []string {
		var out []string
		for _, p := range ps {
			out = append(out, p.Name)
		}
		return out
	}
	order := []string{backend.ProtectionIdentity, backend.ProtectionProcessTree, backend.ProtectionPIDNamespace,
		backend.ProtectionMemoryLimit, backend.ProtectionPidsLimit, backend.ProtectionNetwork, backend.ProtectionPrivateDirs,
		backend.ProtectionPrivateTmp, backend.ProtectionDevices, backend.ProtectionUserNamespaces, backend.ProtectionPrivateFiles}
	byName := func(ps []backend.Protection, name string) backend.Protection {
		i := slices.IndexFunc(ps, func(p backend.Protection) bool { return p.Name == name })
		if i < 0 {
			t.Fatalf("no protection %s in %v", name, names(ps))
		}
		return ps[i]
	}

	on := testBackendWith(t, perProject).Protections()
	if !slices.Equal(names(on), order) {
		t.Fatalf("protections %v, want %v", names(on), order)
	}
	for _, p := range on {
		if !p.On {
			t.Errorf("as root with the defaults, %s is off: %s", p.Name, p.Detail)
		}
	}

	// No setting turns these off: only a machine or privileges that lack
	// them (below, and in the seccomp and private files tests).
	always := []string{backend.ProtectionPrivateDirs, backend.ProtectionPIDNamespace, backend.ProtectionPrivateTmp,
		backend.ProtectionUserNamespaces, backend.ProtectionPrivateFiles}
	off := testBackendWith(t, func(c *Config) { c.User, c.Network, c.NoCgroups = "root", store.NetworkHost, true }).Protections()
	for _, p := range off {
		if slices.Contains(always, p.Name) {
			continue
		}
		if p.On {
			t.Errorf("%s is on with replica.user root, network host and no cgroups: %s", p.Name, p.Detail)
		}
		if p.Detail == "" {
			t.Errorf("%s is off with no reason given", p.Name)
		}
	}
	if d := byName(off, backend.ProtectionNetwork).Detail; !strings.Contains(d, "replica.network: host") {
		t.Errorf("network off says %q, want the setting that turned it off", d)
	}

	// Without CAP_SYS_ADMIN there are no PID or mount namespaces: both say
	// so and what it leaves open.
	b := testBackend(t)
	noNamespaces(b)
	for name, want := range map[string]string{
		backend.ProtectionPIDNamespace: "a child that left its process group outlives an inferd killed with kill -9",
		backend.ProtectionPrivateTmp:   "models share /tmp, /var/tmp and /dev/shm",
	} {
		if p := byName(b.Protections(), name); p.On || !strings.Contains(p.Detail, want) {
			t.Errorf("%s without namespaces: %+v, want off saying %q", name, p, want)
		}
	}
}

func TestCgroupMountsAndOwnCgroup(t *testing.T) {
	hybrid := `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`
	v2, v1 := cgroupMounts([]byte(hybrid))
	if v2 == nil || v2.dir != "/sys/fs/cgroup/unified" || v1["memory"].dir != "/sys/fs/cgroup/memory" || v1["pids"].dir != "/sys/fs/cgroup/pids" || len(v1) != 2 {
		t.Fatalf("hybrid: v2 %+v, v1 %+v", v2, v1)
	}
	pure := `25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`
	if v2, v1 := cgroupMounts([]byte(pure)); v2 == nil || v2.dir != "/sys/fs/cgroup" || len(v1) != 0 {
		t.Fatalf("pure v2: %+v %+v", v2, v1)
	}

	own := ownCgroups([]byte("9:name=systemd:/\n8:pids:/\n4:memory:/process_api/abc\n0::/system.slice/inferd.service\n"))
	if own[""] != "/system.slice/inferd.service" || own["memory"] != "/process_api/abc" || own["pids"] != "/" {
		t.Fatalf("own cgroups %v", own)
	}
	for _, tc := range []struct {
		root, path, want string
		ok               bool
	}{
		{"/", "/process_api/abc", "/m/process_api/abc", true},
		{"/", "/", "/m", true},
		{"/docker/x", "/docker/x/sub", "/m/sub", true}, // a container sees its own sub-tree
		{"/docker/x", "/docker/xy", "", false},
		{"/docker/x", "/other", "", false},
	} {
		got, ok := cgroupDir(mount{dir: "/m", root: tc.root}, tc.path)
		if got != tc.want || ok != tc.ok {
			t.Errorf("cgroupDir(root %s, %s) = %q %v, want %q %v", tc.root, tc.path, got, ok, tc.want, tc.ok)
		}
	}
	if got := unescapeMount(`/mnt/with\040space`); got != "/mnt/with space" {
		t.Errorf("unescapeMount = %q", got)
	}
}

func TestCheckerSpeaksForTheSandbox(t *testing.T) {
	needRoot(t)
	base := t.TempDir()
	for _, d := range []string{filepath.Dir(base), base} { // t.TempDir makes them 0700
		os.Chmod(d, 0o755)
	}
	closedDir := filepath.Join(base, "closed", "model")
	os.MkdirAll(closedDir, 0o755)
	os.Chmod(filepath.Dir(closedDir), 0o700)
	spec := store.ModelSpec{Dir: closedDir, Command: []string{"/bin/sh"}}

	// A uid of the project's own cannot enter a directory only root may.
	fatal, _ := testBackendWith(t, perProject).Checker().Problems(spec)
	want := "dir " + closedDir + " is not readable by a uid of the project's own (replica.user: per-project), who runs the model"
	if len(fatal) != 1 || !strings.HasPrefix(fatal[0], want) {
		t.Errorf("per-project: %q, want one problem starting %q", fatal, want)
	}
	if fatal, _ := testBackend(t).Checker().Problems(spec); len(fatal) != 0 {
		t.Errorf("models as root read it: %q", fatal)
	}

	// Limits and a network the daemon cannot give are warnings.
	spec.Dir, spec.MemoryMiB, spec.PidsMax, spec.Network = base, 100, 10, store.NetworkPrivate
	_, warnings := testBackendWith(t, func(c *Config) { c.User, c.NoCgroups = "root", true }).Checker().Problems(spec)
	if len(warnings) != 2 || !strings.HasPrefix(warnings[0], "memoryMiB: 100 is not enforced here (no cgroup per replica") ||
		!strings.HasPrefix(warnings[1], "pidsMax: 10 is not enforced here") {
		t.Errorf("warnings without cgroups: %q", warnings)
	}
	if _, warnings := testBackend(t).Checker().Problems(spec); len(warnings) != 0 {
		t.Errorf("limits and a network the sandbox gives are warned of: %q", warnings)
	}
}

// A project's logs stay under its budget across boots: a crash loop of models
// that flood their log keeps the newest output and drops the oldest.
func TestCrashLoopStaysWithinTheProjectsLogBudget(t *testing.T) {
	const budget = 64 << 10
	b := testBackendWith(t, func(c *Config) { c.LogMaxBytes, c.LogKeep, c.LogMaxBytesPerProject = 16<<10, 2, budget })
	dir := ""
	for i := range 8 {
		spec := sandboxSpec(fmt.Sprintf("flood-%d", i), `i=0; while [ $i -lt 900 ]; do echo "boot $INFERD_REPLICA_ID line $i padding padding padding"; i=$((i+1)); done; exit 1`)
		spec.ProjectID = "flood"
		p := startModel(t, b, spec)
		waitExited(t, p)
		dir = filepath.Dir(b.logPath(spec))
	}
	var total int64
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || !e.Type().IsRegular() {
			continue
		}
		total += info.Size()
		names = append(names, e.Name())
	}
	if total > budget {
		t.Fatalf("the project's logs hold %d bytes, over its %d budget: %v", total, budget, names)
	}
	if !slices.Contains(names, "flood-7.log") {
		t.Errorf("the newest replica's log was removed: %v", names)
	}
	if slices.Contains(names, "flood-0.log") {
		t.Errorf("the oldest replica's log was kept over newer ones: %v", names)
	}
}

func TestLogBudgetNeverRemovesALiveReplicasFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name string, n int, age time.Duration) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, make([]byte, n), 0o644); err != nil {
			t.Fatal(err)
		}
		mod := time.Now().Add(-age)
		os.Chtimes(path, mod, mod)
		return path
	}
	live := write("a-1.log", 600, time.Hour) // the oldest, but written to
	write("a-1.log.1", 300, 2*time.Hour)
	write("b-1.log", 300, 30*time.Minute)
	write("notes.txt", 5000, 3*time.Hour) // not a log: neither counted nor removed
	lb := newLogBudgets(1000).of(dir)
	lb.attach(live)
	var left []string
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if !slices.Equal(left, []string{"a-1.log", "b-1.log", "notes.txt"}) {
		t.Fatalf("after trimming to 1000 bytes: %v", left)
	}
	// The live replica writes on: 800 + 300 is over, and the oldest file that
	// is not live goes at once, not when the replica ends.
	f, err := os.OpenFile(live, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.Write(make([]byte, 200))
	f.Close()
	if lb.wrote(200) {
		t.Fatal("still over the budget with only the live file left under it")
	}
	if _, err := os.Stat(filepath.Join(dir, "b-1.log")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("b-1.log is still there while a live replica's writes took the project over its budget: %v", err)
	}
	if _, err := os.Stat(live); err != nil {
		t.Fatalf("the live file was removed: %v", err)
	}
}

// The sandbox must not show in the daemon's own state: the threads that made
// namespaces died with them, and a dial goes back to the daemon's namespace.
func TestDialingIntoAReplicaLeavesTheDaemonsNetworkAlone(t *testing.T) {
	needRoot(t)
	b := testBackend(t)
	p := startReady(t, b, echoSpec(t, "ns-1"))
	before, err := os.Readlink("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		r := infer(t, p, fmt.Sprintf(`{"n": %d}`, i))
		if r.Replica != "ns-1" {
			t.Fatalf("call %d answered by %q", i, r.Replica)
		}
		p.client.Close() // the next call dials afresh
	}
	// The dials went back: of the daemon's threads, only the one that forked the
	// model (and waits for it) is in the model's namespace.
	model, err := os.Readlink(fmt.Sprintf("/proc/%d/ns/net", p.pid))
	if err != nil || model == before {
		t.Fatalf("the model's namespace %q (%v) is the daemon's %q", model, err, before)
	}
	tasks, _ := os.ReadDir("/proc/self/task")
	in := 0
	for _, task := range tasks {
		if ns, _ := os.Readlink(filepath.Join("/proc/self/task", task.Name(), "ns/net")); ns == model {
			in++
		}
	}
	if in != 1 {
		t.Errorf("%d of the daemon's threads are in the model's network namespace, want 1 (the one that forked it)", in)
	}
}

// TestWithoutNamespacesTheInitBecomesTheModel: where no PID namespace can
// be made, the init switches to the project's uid, drops every capability
// and execs the model in its own place: the process inferd started is the
// model, and nothing of inferd's stays beside it.
func TestWithoutNamespacesTheInitBecomesTheModel(t *testing.T) {
	needRoot(t)
	b := testBackendWith(t, perProject)
	noNamespaces(b)
	p := startModel(t, b, sandboxSpec("who-plain", whoamiScript))
	out := waitLog(t, b, p, "done")
	uid, _ := strconv.Atoi(field(out, "uid"))
	if uid < DefaultUIDFirst || uid > DefaultUIDLast || field(out, "groups") != strconv.Itoa(uid) {
		t.Errorf("the model runs as %s; want a uid of the range with no other group", out)
	}
	if field(out, "nnp") != "1" || field(out, "capeff") != "0000000000000000" || field(out, "capamb") != "0000000000000000" {
		t.Errorf("no_new_privs %s, effective caps %s, ambient %s; want 1 and none", field(out, "nnp"), field(out, "capeff"), field(out, "capamb"))
	}
	// The model's shell logs "done" just before it execs sleep: the
	// process inferd started becomes sleep only if it is the model itself
	// (an init of inferd's would stay what it is).
	testenv.Eventually(t, 10*time.Second, "the process inferd started to be the model's sleep", func() bool {
		comm, err := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.pid))
		return err == nil && strings.TrimSpace(string(comm)) == "sleep"
	})
}
