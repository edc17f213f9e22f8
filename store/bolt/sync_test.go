package bolt

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/store"
)

// syncChildEnv, set to a directory, makes TestEveryCommitIsSyncedBeforeItReturns
// the traced child: it opens a store there and commits.
const syncChildEnv = "INFERD_SYNC_CHILD"

// TestEveryCommitIsSyncedBeforeItReturns runs a child process (this test
// binary) under strace, which opens a store and makes each kind of commit: a
// call (the group-commit writer, whose commit is the append to the
// write-ahead log), a project and a key (a write transaction of its own).
// Each must fdatasync (or fsync) the data file or its log before it returns
// to its caller: otherwise a call answered as stored is lost with the page
// cache when the machine loses power. bbolt opened with NoSync, or a commit
// path that skips the sync, fails here.
func TestEveryCommitIsSyncedBeforeItReturns(t *testing.T) {
	if dir := os.Getenv(syncChildEnv); dir != "" {
		syncChild(t, dir)
		return
	}
	strace, err := exec.LookPath("strace")
	if err != nil {
		testenv.Missing(t, "strace, to see the data file synced (scripts/test-deps.sh installs it)")
	}
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace")
	cmd := exec.Command(strace, "-f", "-qq", "-s", "128", "-e", "trace=fdatasync,fsync,write", "-e", "signal=none", "-o", trace,
		os.Args[0], "-test.run=^"+t.Name()+"$", "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), syncChildEnv+"="+dir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		if strings.Contains(string(out), "ptrace") {
			testenv.Missing(t, "ptrace for strace: %s", out)
		}
		t.Fatalf("the traced child: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`data file fd (\d+), log fd (\d+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("the child did not say its data file's and log's descriptors:\n%s", out)
	}
	synced := syncsBetweenMarks(t, trace, string(m[1]), string(m[2]))
	for _, op := range syncedOps {
		if synced[op] == 0 {
			t.Errorf("%s returned before the data file was synced (no fdatasync or fsync of it while it ran)", op)
		}
	}
	if t.Failed() {
		t.Logf("syncs of the data file by operation: %v", synced)
	}
}

// syncedOps are the commits the child makes, in order.
var syncedOps = []string{"SaveCall", "PutProject", "CreateScopedKey", "SetTeamQuota"}

// syncChild opens a store in dir, makes each commit of syncedOps between two
// marks written to stderr (one write each: strace shows them among the
// syncs), and then says which descriptors hold the data file and its log
// segment (made by the first call write, open until Close).
func syncChild(t *testing.T, dir string) {
	path := filepath.Join(dir, "inferd.db")
	s := openAt(t, path, Options{})
	defer func() {
		logs, err := WALFiles(path)
		if err != nil || len(logs) != 1 {
			t.Fatalf("log segments: %v, %v", logs, err)
		}
		fmt.Printf("data file fd %d, log fd %d\n", dataFileFD(t, path), dataFileFD(t, logs[0]))
	}()
	do := map[string]func() error{
		"SaveCall": func() error {
			return s.SaveCall(context.Background(), store.Call{ID: newCallID(), ProjectID: "p", TeamID: "acme",
				State: store.CallQueued, Created: time.Now(), Inputs: []byte(`{}`)})
		},
		"PutProject": func() error { _, err := s.PutProject(testProject("p", "acme")); return err },
		"CreateScopedKey": func() error {
			_, _, err := s.CreateScopedKey("acme", store.ScopeTeam, store.KeyLimits{})
			return err
		},
		"SetTeamQuota": func() error { _, err := s.SetTeamQuota("acme", store.Quota{Replicas: 2}); return err },
	}
	// The log segment is made (and synced) by the first call write: the
	// one measured must be synced by its own append.
	if err := do["SaveCall"](); err != nil {
		t.Fatal(err)
	}
	for _, op := range syncedOps {
		os.Stderr.WriteString("inferd-sync-begin " + op + "\n")
		if err := do[op](); err != nil {
			t.Fatalf("%s: %v", op, err)
		}
		os.Stderr.WriteString("inferd-sync-end " + op + "\n")
	}
}

// dataFileFD finds the descriptor this process holds path open with.
func dataFileFD(t *testing.T, path string) int {
	entries, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && target == path {
			fd, _ := strconv.Atoi(e.Name())
			return fd
		}
	}
	t.Fatalf("no descriptor of this process holds %s", path)
	return -1
}

// syncsBetweenMarks reads strace's output and counts, per operation, the
// fdatasync and fsync calls on the descriptors fds made between its marks.
func syncsBetweenMarks(t *testing.T, trace string, fds ...string) map[string]int {
	f, err := os.Open(trace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	mark := regexp.MustCompile(`write\(2, "inferd-sync-(begin|end) (\w+)\\n"`)
	sync := regexp.MustCompile(`\b(fdatasync|fsync)\((` + strings.Join(fds, "|") + `)\b`)
	counts := map[string]int{}
	current := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if m := mark.FindStringSubmatch(line); m != nil {
			if m[1] == "begin" {
				current = m[2]
			} else {
				current = ""
			}
			continue
		}
		if current != "" && sync.MatchString(line) {
			counts[current]++
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return counts
}
