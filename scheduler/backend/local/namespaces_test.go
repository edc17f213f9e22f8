package local

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	"inferd/internal/testenv"
	"inferd/scheduler/backend"
	"inferd/scheduler/backend/local/replicainit"
	"inferd/store"
)

// userNamespaceScript tries, in a child of its own each, what makes a user
// namespace (unshare and clone with CLONE_NEWUSER, and clone3), and a fork.
const userNamespaceScript = `import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
nr = {"x86_64": (272, 56), "aarch64": (97, 220)}[platform.machine()]
def attempt(name, call):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        res = call()
        os.write(w, (os.strerror(ctypes.get_errno()) if res < 0 else "ok").encode())
        os._exit(0)
    os.close(w)
    out = os.read(r, 200).decode()
    os.waitpid(pid, 0)
    print(name + ": " + out, flush=True)
def clone():
    res = libc.syscall(nr[1], 0x10000000 | 17, 0, 0, 0, 0)
    if res == 0:
        os._exit(0)
    if res > 0:
        os.waitpid(res, 0)
    return res
attempt("unshare", lambda: libc.syscall(nr[0], 0x10000000))
attempt("clone", clone)
attempt("clone3", lambda: libc.syscall(435, None, 0))
attempt("fork", lambda: 0)
print("done", flush=True)
`

// TestModelMayNotMakeAUserNamespaceUnlessItsProjectAllows: the filter the
// init installs refuses the model (and what it starts) a user namespace,
// as inferd's own user or a uid of the project's own; allowUserNamespaces
// gives it back.
func TestModelMayNotMakeAUserNamespaceUnlessItsProjectAllows(t *testing.T) {
	py := needPython(t)
	b := testBackend(t)
	if b.sb.filterErr != nil {
		testenv.Missing(t, "a seccomp filter: %v", b.sb.filterErr)
	}
	for _, allowed := range []bool{false, true} {
		t.Run(fmt.Sprintf("allowUserNamespaces %v", allowed), func(t *testing.T) {
			spec := sandboxSpec("userns-"+strconv.FormatBool(allowed), "")
			spec.Model.Command = []string{py, "-c", userNamespaceScript}
			spec.Model.AllowUserNamespaces = allowed
			p := startModel(t, b, spec)
			out := waitLog(t, b, p, "done")
			want := []string{"unshare: Operation not permitted", "clone: Operation not permitted", "clone3: Function not implemented", "fork: ok"}
			if allowed {
				want = []string{"unshare: ok", "clone: ok", "fork: ok"}
			}
			for _, w := range want {
				if !strings.Contains(out, w) {
					t.Errorf("the model printed:\n%s\nwant %q", out, w)
				}
			}
		})
	}
	if p := protection(t, b, backend.ProtectionUserNamespaces); !p.On {
		t.Errorf("userNamespaces is off: %s", p.Detail)
	}
}

// protection is b's protection of that name.
func protection(t *testing.T, b *Backend, name string) backend.Protection {
	t.Helper()
	for _, p := range b.Protections() {
		if p.Name == name {
			return p
		}
	}
	t.Fatalf("no protection %s", name)
	return backend.Protection{}
}

// needNamespaces ends a test that needs replicas in PID and mount
// namespaces of their own.
func needNamespaces(t *testing.T, b *Backend) {
	t.Helper()
	needRoot(t)
	if b.sb.nsErr != nil {
		testenv.Missing(t, "PID and mount namespaces: %v", b.sb.nsErr)
	}
}

// TestReplicaSeesOnlyItsOwnProcesses: in its own /proc a model finds its
// init (1) and its own processes, not the daemon, nor another replica,
// nor their command lines.
func TestReplicaSeesOnlyItsOwnProcesses(t *testing.T) {
	b := testBackend(t)
	needNamespaces(t, b)
	other := startModel(t, b, sandboxSpec("proc-other", "exec sleep 1000"))
	spec := sandboxSpec("proc-1", `echo "pids=$(ls /proc | grep '^[0-9]' | tr '\n' ,)"; `+
		`for pid in $DAEMON $OTHER; do test -e /proc/$pid && echo "sees $pid"; done; echo done; exec sleep 1000`)
	spec.Model.Env = map[string]string{"DAEMON": strconv.Itoa(os.Getpid()), "OTHER": strconv.Itoa(other.pid)}
	p := startModel(t, b, spec)
	out := waitLog(t, b, p, "done")
	pids := strings.Split(strings.TrimSuffix(field(out, "pids"), ","), ",")
	// The init, the shell and the pipeline it forked: a handful.
	if len(pids) == 0 || pids[0] != "1" || len(pids) > 8 {
		t.Errorf("the model's /proc lists %v; want its init (1) and its own few", pids)
	}
	if strings.Contains(out, "sees") {
		t.Errorf("the model sees a process of the host:\n%s", out)
	}
	if q := protection(t, b, backend.ProtectionPIDNamespace); !q.On {
		t.Errorf("pidNamespace is off: %s", q.Detail)
	}
}

// TestPrivateTmpIsTheReplicasOwnAndGoesWithIt: what a model writes to
// /dev/shm, /tmp and /var/tmp is in a tmpfs of its own, which the host
// never sees, is memoryMiB big and goes with the replica.
func TestPrivateTmpIsTheReplicasOwnAndGoesWithIt(t *testing.T) {
	b := testBackend(t)
	needNamespaces(t, b)
	name := "inferd-test-" + strconv.Itoa(os.Getpid())
	spec := sandboxSpec("shm-1", `for d in /dev/shm /tmp /var/tmp; do
  head -c 1048576 /dev/zero > $d/`+name+` && echo "wrote $d"; done
echo "shm=$(df -k /dev/shm | awk 'NR==2{print $2}')"; echo done; exec sleep 1000`)
	spec.Model.MemoryMiB = 64
	p := startModel(t, b, spec)
	out := waitLog(t, b, p, "done")
	for _, d := range replicainit.TmpDirs {
		if !strings.Contains(out, "wrote "+d) {
			t.Errorf("the model could not write to %s:\n%s", d, out)
		}
		if _, err := os.Stat(filepath.Join(d, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("the model's file shows in the host's %s (%v)", d, err)
		}
	}
	if field(out, "shm") != strconv.Itoa(64<<10) {
		t.Errorf("a 64 MiB replica's /dev/shm: %s KiB, want 65536", field(out, "shm"))
	}
	p.stop(testDeadline)
	for _, d := range replicainit.TmpDirs {
		if _, err := os.Stat(filepath.Join(d, name)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s/%s after the replica: %v", d, name, err)
		}
	}
	if q := protection(t, b, backend.ProtectionPrivateTmp); !q.On {
		t.Errorf("privateTmp is off: %s", q.Detail)
	}
}

// TestPrivateTmpIsMemoryMiBBigWithoutACgroup: where no cgroup enforces
// memoryMiB, the tmpfs's own size still keeps /dev/shm within it.
func TestPrivateTmpIsMemoryMiBBigWithoutACgroup(t *testing.T) {
	b := testBackendWith(t, func(c *Config) { c.NoCgroups = true })
	needNamespaces(t, b)
	spec := sandboxSpec("shm-nocg", `if head -c 20000000 /dev/zero > /dev/shm/big; then echo "big fits"; else echo "big refused"; fi; echo done; exec sleep 1000`)
	spec.Model.MemoryMiB = 16
	p := startModel(t, b, spec)
	if out := waitLog(t, b, p, "done"); !strings.Contains(out, "big refused") {
		t.Errorf("20 MB in the /dev/shm of a 16 MiB replica:\n%s\nwant it refused", out)
	}
}

// TestPrivateTmpCountsTowardTheMemoryLimit: tmpfs pages are charged to the
// memory cgroup of the replica that wrote them (checked here on a cgroup v1
// memory controller), so /dev/shm and /tmp together cannot hold more than
// memoryMiB, each within its own size.
func TestPrivateTmpCountsTowardTheMemoryLimit(t *testing.T) {
	b := testBackend(t)
	needNamespaces(t, b)
	if cg := b.sb.cgroups; cg == nil || (!cg.v2Ctl["memory"] && cg.v1["memory"].base == "") {
		testenv.Missing(t, "a memory controller to make cgroups in")
	}
	spec := sandboxSpec("shm-oom", `head -c 40000000 /dev/zero > /dev/shm/a && echo "shm written"
head -c 40000000 /dev/zero > /tmp/b && echo "tmp written"; exec sleep 1000`)
	spec.Model.MemoryMiB = 64
	p := startModel(t, b, spec)
	waitExited(t, p)
	var oom *backend.OutOfMemoryError
	if !errors.As(p.ExitErr(), &oom) || strings.Contains(logText(t, b, p), "tmp written") {
		t.Fatalf("80 MB in /dev/shm and /tmp under memoryMiB 64: exit %v, log:\n%s\nwant an out-of-memory end", p.ExitErr(), logText(t, b, p))
	}
}

// TestModelDirAndHomeUnderTmpAreBoundIn: a model whose dir, program and
// private HOME sit under the host's /tmp (the default TMPDIR) still finds
// them in its own /tmp, and nothing else of the host's.
func TestModelDirAndHomeUnderTmpAreBoundIn(t *testing.T) {
	t.Setenv("TMPDIR", "/tmp") // where the private dirs go
	b := testBackend(t)
	needNamespaces(t, b)
	dir, err := os.MkdirTemp("/tmp", "inferd-model-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	script := filepath.Join(dir, "model.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\n"+`echo "cwd=$(pwd) home=$HOME tmp=$(ls -A /tmp | tr '\n' ,)"; echo hi > "$HOME/x"; cat "$HOME/x"; echo done; exec sleep 1000`+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	spec := shSpec("bound-1", "")
	spec.Model.Command, spec.Model.Dir = []string{script}, dir
	p := startModel(t, b, spec)
	out := waitLog(t, b, p, "done")
	if !strings.HasPrefix(p.box.dir, "/tmp/") || field(out, "cwd") != dir || field(out, "home") != p.box.dir || !strings.Contains(out, "\nhi\n") {
		t.Errorf("the model under /tmp printed:\n%s\nwant cwd %s and a writable HOME %s", out, dir, p.box.dir)
	}
	// Its /tmp holds the two bound paths' first components, nothing else.
	want := map[string]bool{strings.Split(dir, "/")[2]: true, strings.Split(p.box.dir, "/")[2]: true}
	for _, e := range strings.Split(strings.TrimSuffix(field(out, "tmp"), ","), ",") {
		if !want[e] {
			t.Errorf("the model's /tmp shows %q of the host's: %s", e, field(out, "tmp"))
		}
	}
}

// TestScriptNamedUnderTmpIsBoundIn: a model started as `sh
// /tmp/.../model.sh`, its dir elsewhere, still finds the script its command
// names in its own /tmp (make mutate's worktree, a checkout under /tmp).
func TestScriptNamedUnderTmpIsBoundIn(t *testing.T) {
	b := testBackend(t)
	needNamespaces(t, b)
	scripts, err := os.MkdirTemp("/tmp", "inferd-script-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(scripts) })
	if err := os.Chmod(scripts, 0o755); err != nil {
		t.Fatal(err)
	}
	script := filepath.Join(scripts, "model.sh")
	if err := os.WriteFile(script, []byte("echo started; exec sleep 1000\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := shSpec("script-1", "")
	spec.Model.Command = []string{"/bin/sh", script, "--flag=/not/a/path"}
	p := startModel(t, b, spec)
	waitLog(t, b, p, "started")
}

// TestStartFailureIsTheModelsNotTheInits: a program the init cannot start
// is Launch's error, worded as exec words it.
func TestStartFailureIsTheModelsNotTheInits(t *testing.T) {
	b := testBackend(t)
	notExecutable := filepath.Join(t.TempDir(), "model")
	if err := os.WriteFile(notExecutable, []byte("#!/bin/sh\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		command []string
		dir     string
		want    string
	}{
		{"missing program", []string{"/nonexistent/model-server"}, "/", "fork/exec /nonexistent/model-server: no such file or directory"},
		{"missing dir", []string{"sh", "-c", "true"}, "/nonexistent", "chdir /nonexistent: no such file or directory"},
		{"not executable", []string{notExecutable}, "/", "fork/exec " + notExecutable + ": permission denied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := shSpec("fail-"+strings.ReplaceAll(tc.name, " ", "-"), "")
			spec.Model.Command, spec.Model.Dir = tc.command, tc.dir
			_, err := b.start(spec)
			if err == nil || !strings.HasSuffix(err.Error(), tc.want) {
				t.Fatalf("start = %v, want it to end %q", err, tc.want)
			}
			if tc.name == "not executable" && !errors.Is(err, os.ErrPermission) {
				t.Errorf("%v is not os.ErrPermission", err)
			}
		})
	}
}

// TestRelativeDirIsTheDaemonsWorkingDirectorys: a model dir given relative
// (doctor's examples/echo) is found from the daemon's working directory,
// as exec would, although the init itself starts in /.
func TestRelativeDirIsTheDaemonsWorkingDirectorys(t *testing.T) {
	b := testBackend(t)
	spec := shSpec("rel-1", `echo "cwd=$(pwd)"; echo done; exec sleep 1000`)
	spec.Model.Dir = "."
	p := startModel(t, b, spec)
	wd, _ := os.Getwd()
	if out := waitLog(t, b, p, "done"); field(out, "cwd") != wd {
		t.Errorf("a model of dir . runs in %q, want %q", field(out, "cwd"), wd)
	}
}

// BenchmarkReplicaStartAndExit: a replica of `sh -c 'exit 0'`, from Launch
// to Exited (no cgroup, host network, as root), through its init in PID and
// mount namespaces and through an init that execs the model in its place,
// beside the same sh forked and exec'd straight (what a replica cost before
// the init, less the log and pid file): the init's share of a boot.
func BenchmarkReplicaStartAndExit(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		for range b.N {
			cmd := exec.Command("sh", "-c", "exit 0")
			cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
			if err := cmd.Run(); err != nil {
				b.Fatal(err)
			}
		}
	})
	for _, namespaces := range []bool{false, true} {
		b.Run(fmt.Sprintf("init namespaces=%v", namespaces), func(b *testing.B) {
			dir := b.TempDir()
			be, err := New(Config{LogDir: filepath.Join(dir, "logs"), RunDir: filepath.Join(dir, "run"), User: "root", NoCgroups: true, Network: store.NetworkHost}, zerolog.Nop())
			if err != nil {
				b.Fatal(err)
			}
			defer be.Close()
			if !namespaces {
				noNamespaces(be)
			} else if be.sb.nsErr != nil {
				b.Skipf("no namespaces here: %v", be.sb.nsErr)
			}
			for range b.N {
				p, err := be.start(shSpec("bench-1", "exit 0"))
				if err != nil {
					b.Fatal(err)
				}
				<-p.Exited()
			}
		})
	}
}
