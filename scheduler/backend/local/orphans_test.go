package local

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// helperEnv, when set to a directory, makes TestHelperDaemon act as a daemon that
// starts a replica there and then waits to be killed.
const helperEnv = "INFERD_REPLICA_TEST_HELPER_DIR"

// startGroup starts a command as the leader of a new process group with env, the way
// a previous daemon would have, and reaps it when the test ends.
func startGroup(t *testing.T, env []string, name string, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(name, args...)
	cmd.Env = env
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
	})
	return cmd
}

func TestKillOrphansKillsRecordedGroups(t *testing.T) {
	tests := []struct {
		name string
		// setup records orphans in runDir and returns the pids that must die and
		// those that must survive.
		setup      func(t *testing.T, runDir string) (die, live []int)
		wantKilled int
	}{
		{
			name: "leader gone, child left in the group",
			setup: func(t *testing.T, runDir string) ([]int, []int) {
				// sh exits at once; its sleep stays in the group, like a grandchild
				// after Pdeathsig killed the leader.
				cmd := exec.Command("sh", "-c", "sleep 1000 >/dev/null 2>&1 & echo $!")
				cmd.Env = []string{"INFERD_REPLICA_ID=orphan-1", "PATH=" + os.Getenv("PATH")}
				cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
				out, err := cmd.Output()
				if err != nil {
					t.Fatal(err)
				}
				child, _ := strconv.Atoi(strings.TrimSpace(string(out)))
				t.Cleanup(func() { syscall.Kill(child, syscall.SIGKILL) })
				writeTestPidFile(t, runDir, "orphan-1", cmd.Process.Pid)
				return []int{child}, nil
			},
			wantKilled: 1,
		},
		{
			name: "recycled pid of another program is left alone",
			setup: func(t *testing.T, runDir string) ([]int, []int) {
				cmd := startGroup(t, []string{"INFERD_REPLICA_ID=someone-else"}, "sleep", "1000")
				writeTestPidFile(t, runDir, "orphan-2", cmd.Process.Pid)
				return nil, []int{cmd.Process.Pid}
			},
		},
		{
			name: "group already gone",
			setup: func(t *testing.T, runDir string) ([]int, []int) {
				cmd := exec.Command("true")
				if err := cmd.Run(); err != nil {
					t.Fatal(err)
				}
				writeTestPidFile(t, runDir, "orphan-3", cmd.Process.Pid)
				return nil, nil
			},
		},
		{
			name: "unreadable record",
			setup: func(t *testing.T, runDir string) ([]int, []int) {
				os.WriteFile(filepath.Join(runDir, "junk.pid"), []byte("not json"), 0o600)
				os.WriteFile(filepath.Join(runDir, "half.pid.tmp"), []byte("{"), 0o600)
				return nil, nil
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			runDir := t.TempDir()
			die, live := tc.setup(t, runDir)
			os.WriteFile(filepath.Join(runDir, "README"), []byte("not ours"), 0o600)

			n, err := killOrphans(runDir, testLogger(t))
			if err != nil || n != tc.wantKilled {
				t.Fatalf("killOrphans = %d, %v; want %d", n, err, tc.wantKilled)
			}
			for _, pid := range die {
				waitGone(t, pid)
			}
			for _, pid := range live {
				if processGone(pid) {
					t.Errorf("process %d was killed", pid)
				}
			}
			files, _ := os.ReadDir(runDir)
			if len(files) != 1 || files[0].Name() != "README" {
				t.Errorf("run dir holds %v, want only README", files)
			}
		})
	}
}

func writeTestPidFile(t *testing.T, runDir, id string, pid int) {
	t.Helper()
	if err := writePidFile(runDir, pidFile{ID: id, Pid: pid, Pgid: pid}); err != nil {
		t.Fatal(err)
	}
}

// A replica this test started and then "forgot": the daemon that knew it is gone,
// only the pid file remains. Cleaning up, directly or as the next daemon's backend
// does at start, kills it and the child in its group.
func TestKillOrphansKillsAForgottenReplica(t *testing.T) {
	tests := []struct {
		name  string
		clean func(t *testing.T, runDir string)
	}{
		{"killOrphans", func(t *testing.T, runDir string) {
			n, err := killOrphans(runDir, testLogger(t))
			if err != nil || n != 1 {
				t.Fatalf("killOrphans = %d, %v; want 1", n, err)
			}
		}},
		{"Recover of the next daemon's backend", func(t *testing.T, runDir string) {
			next, err := New(Config{RunDir: runDir, User: "root"}, testLogger(t))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(next.Close)
			if err := next.Recover(context.Background()); err != nil {
				t.Fatalf("Recover: %v", err)
			}
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			b := testBackend(t)
			p := startModel(t, b, shSpec("forgotten-1", `sleep 1000 & echo "child $!"; wait`))
			waitFor(t, "the child to start", func() bool { return strings.HasPrefix(p.LastLogLine(), "child ") })
			child, _ := strconv.Atoi(strings.TrimPrefix(p.LastLogLine(), "child "))
			child = hostPid(t, p, child)

			tc.clean(t, b.cfg.RunDir)
			waitExited(t, p)
			if got := fmt.Sprint(p.ExitErr()); got != "signal: killed" {
				t.Errorf("ExitErr = %s, want signal: killed", got)
			}
			waitGone(t, child)
			if files, _ := os.ReadDir(b.cfg.RunDir); len(files) != 0 {
				t.Errorf("pid files left: %v", files)
			}
		})
	}
}

func TestKillOrphansWithoutRunDir(t *testing.T) {
	n, err := killOrphans(filepath.Join(t.TempDir(), "missing"), testLogger(t))
	if n != 0 || err != nil {
		t.Fatalf("killOrphans = %d, %v", n, err)
	}
	b, err := New(Config{User: "root"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if err := b.Recover(context.Background()); err != nil {
		t.Errorf("Recover without a run dir: %v", err)
	}
}

// helperNoNamespacesEnv asks TestHelperDaemon for replicas without PID
// namespaces.
const helperNoNamespacesEnv = "INFERD_TEST_HELPER_NO_NAMESPACES"

// TestReplicaDiesWithItsDaemon kills a daemon (this test binary, re-executed as
// TestHelperDaemon) with SIGKILL, whose replica left a grandchild in its
// process group. In a PID namespace of its own, the replica's init dies by
// its parent-death signal and the kernel ends the whole namespace: nothing
// is left within a second, and nothing for the next daemon to find. Without
// one, Pdeathsig takes only the replica's leader down, and killOrphans must
// find the grandchild.
func TestReplicaDiesWithItsDaemon(t *testing.T) {
	for _, namespaces := range []bool{true, false} {
		t.Run(fmt.Sprintf("namespaces %v", namespaces), func(t *testing.T) {
			if err := testBackend(t).sb.nsErr; namespaces && err != nil {
				testenv.Missing(t, "PID namespaces: %v", err)
			}
			testReplicaDiesWithItsDaemon(t, namespaces)
		})
	}
}

func testReplicaDiesWithItsDaemon(t *testing.T, namespaces bool) {
	dir := t.TempDir()
	daemon := exec.Command(os.Args[0], "-test.run=^TestHelperDaemon$")
	daemon.Env = append(os.Environ(), helperEnv+"="+dir, fmt.Sprintf("%s=%v", helperNoNamespacesEnv, !namespaces))
	daemon.Stderr = os.Stderr
	stdout, err := daemon.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := daemon.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { daemon.Process.Kill(); daemon.Wait() })

	var replica, child int
	lines := bufio.NewScanner(stdout)
	for lines.Scan() {
		if _, err := fmt.Sscanf(lines.Text(), "replica %d child %d", &replica, &child); err == nil {
			break
		}
	}
	if replica == 0 || child <= 1 {
		t.Fatalf("helper daemon printed no replica (scan error %v)", lines.Err())
	}

	if err := daemon.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	daemon.Wait()
	if namespaces {
		// A second, not a test deadline: the promise is that nothing of
		// the replica outlives its daemon by more.
		deadline := time.Now().Add(time.Second)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for !processGone(replica) || !processGone(child) {
			if time.Now().After(deadline) {
				t.Fatalf("a second after the daemon's SIGKILL, its replica (%d gone: %v) or the grandchild (%d gone: %v) lives",
					replica, processGone(replica), child, processGone(child))
			}
			<-tick.C
		}
		if n, err := killOrphans(filepath.Join(dir, "run"), testLogger(t)); err != nil || n != 0 {
			t.Fatalf("killOrphans = %d, %v; want nothing left to kill", n, err)
		}
	} else {
		waitGone(t, replica)
		if processGone(child) {
			t.Fatal("the grandchild died too: this test no longer shows killOrphans' job")
		}
		n, err := killOrphans(filepath.Join(dir, "run"), testLogger(t))
		if err != nil || n != 1 {
			t.Fatalf("killOrphans = %d, %v; want 1", n, err)
		}
		waitGone(t, child)
	}

	// The next daemon's Recover also removes what the sandbox held for the
	// replica: its cgroup and its private directory.
	next, err := New(Config{RunDir: filepath.Join(dir, "run"), User: "root"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(next.Close)
	if err := next.Recover(context.Background()); err != nil {
		t.Fatalf("Recover: %v", err)
	}
	if left, _ := os.ReadDir(next.sb.dirs.base); len(left) != 0 {
		t.Errorf("private dirs left after Recover: %v", left)
	}
}

// TestHelperDaemon is not a test: TestReplicaDiesWithItsDaemon runs the test binary
// with helperEnv set to play a daemon that starts one replica and is then killed.
func TestHelperDaemon(t *testing.T) {
	dir := os.Getenv(helperEnv)
	if dir == "" {
		t.Skip("helper process for TestReplicaDiesWithItsDaemon")
	}
	b, err := New(Config{LogDir: filepath.Join(dir, "logs"), RunDir: filepath.Join(dir, "run"), User: "root"}, testLogger(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if os.Getenv(helperNoNamespacesEnv) == "true" {
		noNamespaces(b)
	}
	p, err := b.start(shSpec("daemon-child-1", `sleep 1000 & echo "child $!"; wait`))
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the child to start", func() bool { return strings.HasPrefix(p.LastLogLine(), "child ") })
	child, _ := strconv.Atoi(strings.TrimPrefix(p.LastLogLine(), "child "))
	fmt.Printf("replica %d child %d\n", p.pid, hostPid(t, p, child))
	select {
	case <-p.Exited():
		t.Fatalf("replica exited while its daemon lives: %v", p.ExitErr())
	case <-time.After(time.Minute):
		t.Fatal("helper daemon was not killed")
	}
}
