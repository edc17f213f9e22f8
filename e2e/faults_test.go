package e2e

// Fault tests: the real binary is killed with SIGKILL under load, killed at
// crash points inside the commit path, given a full disk and a corrupt data
// file. docs/reliability.md lists what each proves. `make test` runs a short
// version; `make faults` a longer soak (INFERD_SOAK_ROUNDS, INFERD_SOAK_CALLS).

import (
	"crypto/rand"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/store"
	"inferd/store/bolt"
)

const msgRestart = "error: interrupted by a server restart"

// callLedger is what the test knows of every call the daemon accepted.
type callLedger struct {
	mu          sync.Mutex
	index       map[string]int    // callID → its "i" input
	final       map[string]string // callID → the final message it first answered
	issued      int               // start requests sent
	unreturned  int               // calls found stored whose callID never reached the client
	problems    []error
	interrupted int
}

func newLedger() *callLedger {
	return &callLedger{index: map[string]int{}, final: map[string]string{}}
}

func (l *callLedger) fail(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.problems = append(l.problems, err)
}

func (l *callLedger) add(id string, i int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.index[id] = i
}

func (l *callLedger) ids() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	ids := make([]string, 0, len(l.index))
	for id := range l.index {
		ids = append(ids, id)
	}
	return ids
}

func (l *callLedger) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.index)
}

// observe checks one answer for call id: a success must carry this call's own
// input, the only error allowed is the restart one, and a final answer must
// never change.
func (l *callLedger) observe(id string, r map[string]any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	msg := message(r)
	if !isFinal(r) {
		if _, final := l.final[id]; final {
			l.problems = append(l.problems, fmt.Errorf("call %s answered %q after it had ended", id, msg))
		}
		return
	}
	switch msg {
	case "success":
		if got, ok := echoedIndex(r); !ok || got != l.index[id] {
			l.problems = append(l.problems, fmt.Errorf("call %s (input %d) answered another call's result: %v", id, l.index[id], r))
		}
	case msgRestart:
	default:
		l.problems = append(l.problems, fmt.Errorf("call %s (input %d): %q", id, l.index[id], msg))
	}
	if prev, ok := l.final[id]; ok && prev != msg {
		l.problems = append(l.problems, fmt.Errorf("call %s answered %q, then %q", id, prev, msg))
	}
	if _, ok := l.final[id]; !ok {
		l.final[id] = msg
		if msg == msgRestart {
			l.interrupted++
		}
	}
}

func (l *callLedger) check(t *testing.T) {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, err := range l.problems {
		if i == 20 {
			t.Errorf("... and %d more", len(l.problems)-20)
			break
		}
		t.Error(err)
	}
	if len(l.problems) > 0 {
		t.FailNow()
	}
}

// soakCall is the i-th call of the load: mostly queued work on project a
// (two replicas, so a queue builds), every 4th a synchronous call on project
// b, every 10th one that leaves a child process in its replica's group.
func soakCall(i int) (modelKey, inputs string, startOnly bool) {
	switch {
	case i%10 == 0:
		return "mk-a", fmt.Sprintf(`{"i":%d,"spawn":true}`, i), true
	case i%4 == 1:
		return "mk-b", fmt.Sprintf(`{"i":%d,"sleep":0.02}`, i), false
	default:
		return "mk-a", fmt.Sprintf(`{"i":%d,"sleep":0.05}`, i), true
	}
}

// loadGen runs workers that start calls until stopped or the daemon is gone.
type loadGen struct {
	stop atomic.Bool
	wg   sync.WaitGroup
}

func startLoad(c faultClient, l *callLedger, next *atomic.Int64, workers int) *loadGen {
	g := &loadGen{}
	for range workers {
		g.wg.Add(1)
		go func() {
			defer g.wg.Done()
			for !g.stop.Load() {
				i := int(next.Add(1))
				modelKey, inputs, startOnly := soakCall(i)
				l.mu.Lock()
				l.issued++
				l.mu.Unlock()
				r, err := c.start(modelKey, inputs, startOnly)
				if r == nil {
					return // the daemon is gone: the test killed it
				}
				id, _ := r["callID"].(string)
				if err != nil || id == "" || strings.HasPrefix(message(r), "error:") {
					l.fail(fmt.Errorf("start of call %d: %v %v", i, r, err))
					continue
				}
				l.add(id, i)
				l.observe(id, r)
			}
		}()
	}
	return g
}

// verify asks the daemon about every call in the ledger, 8 at a time; with
// wait it long-polls each until it has ended.
func verify(c faultClient, l *callLedger, wait bool) {
	ids := l.ids()
	work := make(chan string)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for id := range work {
				var r map[string]any
				var err error
				if wait {
					r, err = c.final(id)
				} else {
					r, err = c.check(id, false)
				}
				if err != nil {
					l.fail(fmt.Errorf("call %s does not answer: %v", id, err))
					continue
				}
				l.observe(id, r)
			}
		}()
	}
	for _, id := range ids {
		work <- id
	}
	close(work)
	wg.Wait()
}

// TestDaemonKillUnderLoad kills the daemon with SIGKILL while hundreds of calls
// are queued, running and finished, restarts it, and repeats. Every callID
// ever returned must keep answering with its own result (or the restart
// error for calls that were running), nothing stored may be lost, the data
// file must stay consistent, and no model process may outlive its daemon.
func TestDaemonKillUnderLoad(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	rounds := envInt(t, "INFERD_SOAK_ROUNDS", 3)
	perRound := envInt(t, "INFERD_SOAK_CALLS", 80)
	dir, cfg := newDaemonDir(t, noLimits+"cpuSlots: 4\nstartWait: 1s\nlongPollWait: 5s\nmaxQueuedPerProject: 100000\n"+
		"replica:\n  stopGrace: 2s\n  restartBackoff: 100ms\n")
	dataFile := filepath.Join(dir, "data", "inferd.db")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" +
		echoProject("soak-a", "acme", "mk-a", echo, mark, "") + "    minReplicas: 1\n    maxReplicas: 2\n" +
		echoProject("soak-b", "acme", "mk-b", echo, mark, "") + "    maxReplicas: 1\n    idleTimeout: 1\n" +
		echoProject("soak-c", "acme", "mk-c", echo, mark, "") + "    minReplicas: 1\n    maxReplicas: 1\n")

	l := newLedger()
	var next atomic.Int64
	sawQueued, orphans := 0, 0
	for round := 1; round <= rounds; round++ {
		c := faultClient{base: d.base, key: key}
		want := l.count() + perRound
		g := startLoad(c, l, &next, 8)
		eventually(t, 3*time.Minute, fmt.Sprintf("round %d: %d callIDs returned", round, want), func() bool { return l.count() >= want })
		// A call holding soak-c's one replica until the kill (it would
		// run for 10 minutes), and a short one queued behind it: whatever
		// the box's speed, the kill meets a call running and one queued.
		// (The load alone on a loaded box can be slower than its 50 ms
		// calls, and every kill found nothing in flight.)
		var held []string
		for _, sleep := range []string{"600", "0.05"} {
			i := int(next.Add(1))
			l.mu.Lock()
			l.issued++
			l.mu.Unlock()
			r, err := c.start("mk-c", fmt.Sprintf(`{"i":%d,"sleep":%s}`, i, sleep), true)
			id, _ := r["callID"].(string)
			if err != nil || id == "" {
				t.Fatalf("round %d: start of a soak-c call: %v %v", round, r, err)
			}
			l.add(id, i)
			l.observe(id, r)
			held = append(held, id)
		}
		eventually(t, time.Minute, fmt.Sprintf("round %d: a soak-c call running and one queued", round), func() bool {
			r0, err0 := c.check(held[0], false)
			r1, err1 := c.check(held[1], false)
			return err0 == nil && err1 == nil && message(r0) == "running" && message(r1) == "queued"
		})
		sawQueued++
		before := processesWithEnv(mark)
		d.kill()
		g.stop.Store(true)
		g.wg.Wait()

		stored := readDataFile(t, dataFile)
		for _, id := range l.ids() {
			if _, ok := stored[id]; !ok {
				t.Fatalf("round %d: call %s was returned to the client but is not in the data file", round, id)
			}
		}
		for id, sc := range stored {
			if _, known := l.index[id]; !known {
				// Committed, but the kill came before its answer reached the
				// client: it must answer like any other.
				l.add(id, inputIndex(sc))
				l.unreturned++
			}
		}

		d = startDaemon(t, dir, cfg)
		gone := func() bool {
			now := map[int]bool{}
			for _, pid := range processesWithEnv(mark) {
				now[pid] = true
			}
			left := 0
			for _, pid := range before {
				if now[pid] {
					left++
				}
			}
			orphans = left
			return left == 0
		}
		eventually(t, 20*time.Second, "every model process of the killed daemon is gone", gone)
		verify(faultClient{base: d.base, key: key}, l, false)
		l.check(t)
	}
	verify(faultClient{base: d.base, key: key}, l, true)
	l.check(t)
	d.stop()
	eventually(t, 20*time.Second, "no model process after shutdown", func() bool { return len(processesWithEnv(mark)) == 0 })
	stored := readDataFile(t, dataFile)
	for id, c := range stored {
		if !c.State.Done() {
			t.Errorf("call %s is still %s in the data file after every call answered", id, c.State)
		}
	}
	if len(stored) != l.count() {
		t.Errorf("data file holds %d calls, the test knows %d", len(stored), l.count())
	}
	if l.interrupted == 0 || sawQueued == 0 {
		t.Errorf("the load never had calls running (%d interrupted) and queued (%d seen) at a kill: the test proves nothing",
			l.interrupted, sawQueued)
	}
	report(t, "calls issued %d; callIDs returned %d; stored but unanswered at a kill %d; kill -9 restarts survived %d; "+
		"succeeded %d; interrupted by a restart %d; calls lost 0; results changed 0; orphans %d",
		l.issued, l.count()-l.unreturned, l.unreturned, rounds, l.count()-l.interrupted, l.interrupted, orphans)
}

// TestCrashPointsInCommitPath kills the daemon (SIGKILL, from a failpoint
// compiled into a test build: store/bolt/failpoint.go) just before and just after
// the commit that stores a new call, and the one that stores a result. After
// a restart every stored call answers, every returned callID is stored, and a
// call whose commit never happened was never returned. The sync cases crash
// on the path of a synchronous start that outlasts startWait: its call is
// first written, queued, when the wait ends, and only then answered.
func TestCrashPointsInCommitPath(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	bin := failpointBinary(t)
	for _, tc := range []struct {
		point string
		// sync: call 0 (startOnly) holds the only replica for 30 s and
		// every later call is a synchronous start, still queued when its
		// 1 s startWait ends: the 2nd queued-call commit is call 1's.
		sync bool
		// The calls the file holds after the crash: the calls returned
		// before it, plus extra (stored, never returned; -1: the call in
		// flight may be either); finals counts the stored results (-1: any; below -1: at least -finals).
		extra, finals int
	}{
		{point: "call-before:4", extra: 0, finals: -1},
		{point: "call-after:4", extra: 1, finals: -1},
		{point: "result-before:3", extra: 0, finals: 2},
		{point: "result-after:3", extra: 0, finals: 3},
		// Killed after the log's commit, while the applier copies it into
		// the data file: the writes are durable (their callers may have
		// heard), so the restart replays every one of them, and a copy
		// already made is not made twice. The copy takes whatever was
		// logged meanwhile, later calls' writes too: how many calls and
		// results the log holds at the kill varies, never one a client
		// was given that is missing.
		{point: "call-apply-before:4", extra: -1, finals: -1},
		{point: "call-apply-after:4", extra: -1, finals: -1},
		{point: "result-apply-before:3", extra: -1, finals: -3},
		{point: "result-apply-after:3", extra: -1, finals: -3},
		{point: "call-before:2", sync: true, extra: 0, finals: 0},
		{point: "call-after:2", sync: true, extra: 1, finals: 0},
	} {
		name := tc.point
		if tc.sync {
			name += " sync start"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel() // a daemon and data file of its own
			dir, cfg := newDaemonDir(t, noLimits+"startWait: 1s\nlongPollWait: 5s\n")
			dataFile := filepath.Join(dir, "data", "inferd.db")
			mark := marker()
			d := startDaemonWith(t, dir, cfg, bin, "INFERD_REPLICA_USER=root", "INFERD_FAILPOINT="+tc.point)
			key := d.createKey("acme", false)
			d.apply("projects:\n" + echoProject("fp", "acme", "mk-fp", echo, mark, "") + "    minReplicas: 1\n    maxReplicas: 1\n")
			c := faultClient{base: d.base, key: key}
			waitResults := strings.HasPrefix(tc.point, "result")

			returned := map[string]int{}
			crashedAt := -1
			// The applier copies what was logged in the last 25 ms at
			// once: calls go on until its kill, which a fast start loop
			// may otherwise finish before.
			calls := 20
			if strings.Contains(tc.point, "-apply-") {
				calls = 300
			}
			for i := 0; i < calls && crashedAt < 0; i++ {
				inputs, startOnly := fmt.Sprintf(`{"i":%d,"sleep":0.01}`, i), true
				if tc.sync {
					inputs, startOnly = fmt.Sprintf(`{"i":%d}`, i), i == 0
					if i == 0 {
						inputs = `{"i":0,"sleep":30}`
					}
				}
				r, err := c.start("mk-fp", inputs, startOnly)
				if r == nil {
					crashedAt = i
					break
				}
				if err != nil || message(r) == "" || strings.HasPrefix(message(r), "error:") {
					t.Fatalf("call %d: %v %v", i, r, err)
				}
				returned[r["callID"].(string)] = i
				if waitResults {
					// One call at a time, so the n-th result commit is the
					// n-th call's.
					if res, err := c.final(r["callID"].(string)); res == nil {
						crashedAt = i
					} else if err != nil || message(res) != "success" {
						t.Fatalf("call %d: %v %v", i, res, err)
					}
				}
			}
			if crashedAt < 0 {
				t.Fatal("the failpoint was never reached")
			}
			if tc.sync && crashedAt != 1 {
				// Its callID was answered before its write committed (the
				// checks below then find it returned but not stored), or
				// the calls did not go as the case says.
				t.Errorf("the crash came at call %d, want the first sync start's (1)", crashedAt)
			}
			<-d.exited
			d.logs.waitFor(t, "failpoint "+strings.Split(tc.point, ":")[0]+" reached", time.Second)
			eventually(t, 20*time.Second, "the killed daemon's model processes are gone", func() bool {
				return len(processesWithEnv(mark)) == 0
			})

			stored := readDataFile(t, dataFile)
			finals := 0
			for id, sc := range stored {
				if sc.State.Done() {
					finals++
				}
				if _, ok := returned[id]; !ok {
					if got := inputIndex(sc); got != crashedAt {
						t.Errorf("stored call %s was never returned, and it is not the one in flight at the crash (input %d, crash at %d)", id, got, crashedAt)
					}
				}
			}
			for id := range returned {
				if _, ok := stored[id]; !ok {
					t.Errorf("call %s was returned but is not stored", id)
				}
			}
			if got := len(stored) - len(returned); tc.extra >= 0 && got != tc.extra {
				t.Errorf("the data file holds %d calls never returned to a client, want %d", got, tc.extra)
			}
			if tc.finals >= 0 && finals != tc.finals || tc.finals < -1 && finals < -tc.finals {
				t.Errorf("the data file holds %d results, want %d (negative: at least)", finals, tc.finals)
			}

			// The normal binary takes over the same data file.
			d = startDaemon(t, dir, cfg)
			c.base = d.base
			l := newLedger()
			for id, sc := range stored {
				l.add(id, inputIndex(sc))
			}
			verify(c, l, true)
			l.check(t)
			report(t, "%d callIDs returned before the crash, %d calls stored (%d results); every stored call answers after the restart",
				len(returned), len(stored), finals)
		})
	}
}

// TestStartRefusesCorruptDataFile starts the binary on a damaged data file:
// it must exit with a message that names the file and the remedy, and leave
// the file exactly as it was, never start empty over it.
func TestStartRefusesCorruptDataFile(t *testing.T) {
	t.Parallel()
	// A real data file with ~2 MB of call records, so that a cut at 1 MiB
	// falls inside pages the file needs.
	realDir, realCfg := newDaemonDir(t, noLimits)
	d := startDaemon(t, realDir, realCfg)
	key := d.createKey("acme", false)
	echo := echoDir(t)
	d.apply("projects:\n" + echoProject("big", "acme", "mk-big", echo, marker(), "") + "    maxReplicas: 1\n")
	pad := strings.Repeat("x", 100<<10)
	c := faultClient{base: d.base, key: key}
	for i := 0; i < 20; i++ {
		if r, err := c.start("mk-big", fmt.Sprintf(`{"i":%d,"pad":%q}`, i, pad), true); err != nil {
			t.Fatalf("call %d: %v %v", i, r, err)
		}
	}
	d.stop()
	real, err := os.ReadFile(filepath.Join(realDir, "data", "inferd.db"))
	if err != nil {
		t.Fatal(err)
	}
	if len(real) < 2<<20 {
		t.Fatalf("the data file is only %d bytes", len(real))
	}
	random := make([]byte, 256<<10)
	rand.Read(random)
	zeroedMeta := append([]byte(nil), real...)
	clear(zeroedMeta[:8192])
	// Flipped bytes in the element table of a leaf and of a branch page the
	// file uses: once each crashed the daemon with a raw panic inside bbolt.
	pages, pageSize, err := bolt.TreePages(filepath.Join(realDir, "data", "inferd.db"), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	flipped := func(kind string) []byte {
		if len(pages[kind]) == 0 {
			t.Fatalf("the data file has no %s page", kind)
		}
		b := append([]byte(nil), real...)
		at := pages[kind][0]*pageSize + 16
		for i := at; i < at+16; i++ {
			b[i] ^= 0xff
		}
		return b
	}

	cases := []struct {
		name    string
		content []byte
	}{
		{"random bytes", random},
		{"a text file", []byte("not a database\n")},
		{"a 0-byte file", []byte{}},
		{"truncated to 1 MiB", real[:1<<20]},
		{"truncated inside the meta pages", real[:6000]},
		{"meta pages zeroed", zeroedMeta},
		{"flipped bytes in a leaf page", flipped("leaf")},
		{"flipped bytes in a branch page", flipped("branch")},
	}
	var refused atomic.Int64
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir, cfg := newDaemonDir(t, noLimits)
			path := filepath.Join(dir, "data", "inferd.db")
			if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, tc.content, 0o600); err != nil {
				t.Fatal(err)
			}
			cmd := exec.Command(inferdBin, "--config", cfg, "serve")
			done := make(chan struct{})
			timer := time.AfterFunc(time.Minute, func() {
				select {
				case <-done:
				default:
					cmd.Process.Kill()
				}
			})
			out, err := cmd.CombinedOutput()
			close(done)
			timer.Stop()
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() <= 0 {
				t.Fatalf("inferd serve on a corrupt file: %v, want a non-zero exit; output:\n%s", err, out)
			}
			for _, want := range []string{path, "corrupt or not an inferd database", "restore from a backup", "inferd restore"} {
				if !strings.Contains(string(out), want) {
					t.Errorf("the start-up error does not mention %q:\n%s", want, out)
				}
			}
			for _, crash := range []string{"panic", "fatal error", "goroutine "} {
				if strings.Contains(string(out), crash) {
					t.Errorf("inferd crashed instead of refusing the file (%q):\n%s", crash, out)
				}
			}
			if strings.Contains(string(out), "inferd serving") {
				t.Error("inferd served on a corrupt file")
			}
			after, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if string(after) != string(tc.content) {
				t.Error("start-up changed the corrupt file")
			}
			if !t.Failed() {
				refused.Add(1)
			}
		})
	}
	report(t, "corrupt data files refused with the file's name and the restore command, left untouched: %d of %d "+
		"(random bytes, text, 0 bytes, truncated ×2, meta zeroed, flipped bytes in a leaf and in a branch page)",
		refused.Load(), len(cases))
}

// TestGracefulShutdownDrainsRunningCalls sends SIGTERM while a 5 s call
// (stretched by testenv.Scale on a busy machine, so that it still runs when
// the signal comes) runs,
// a long poll waits on it and a second call is queued behind it. The daemon
// refuses new calls at once, finishes the running one and hands its success
// to the poller, then exits; the queued call stays queued in the data file
// and runs after the restart. With a deadline shorter than the call, only
// the call still running at the deadline ends as interrupted.
func TestGracefulShutdownDrainsRunningCalls(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	const callRuns = 5 * time.Second
	for _, tc := range []struct {
		name            string
		shutdownTimeout string
		want            string // what the poller of the running call reads
	}{
		{"the running call finishes", scaledSetting(6 * callRuns), "success"},
		{"the deadline interrupts it", "1s", msgRestart},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // a daemon and data file of its own
			dir, cfg := newDaemonDir(t, "startWait: 1s\nlongPollWait: 50s\nshutdownTimeout: "+tc.shutdownTimeout+"\n")
			d := startDaemon(t, dir, cfg)
			key := d.createKey("acme", false)
			mark := marker()
			d.apply("projects:\n" + echoProject("drain", "acme", "mk-drain", echo, mark, "") + "    maxReplicas: 1\n")
			c := faultClient{base: d.base, key: key}

			var ids []string
			for i, sleep := range []string{strconv.FormatFloat(testenv.Scale(callRuns).Seconds(), 'f', 1, 64), "0.01"} {
				r, err := c.start("mk-drain", fmt.Sprintf(`{"i":%d,"sleep":%s}`, i, sleep), true)
				if err != nil || r["callID"] == nil || r["callID"] == "" {
					t.Fatalf("start call %d: %v %v", i, r, err)
				}
				ids = append(ids, r["callID"].(string))
			}
			eventually(t, time.Minute, "call 0 running, call 1 queued", func() bool {
				r0, _ := c.check(ids[0], false)
				r1, _ := c.check(ids[1], false)
				return message(r0) == "running" && message(r1) == "queued"
			})
			polled := make(chan map[string]any, 1)
			go func() {
				r, err := c.check(ids[0], true)
				if err != nil {
					r = map[string]any{"message": "transport error: " + err.Error()}
				}
				polled <- r
			}()
			eventually(t, 10*time.Second, "the long poll waiting", func() bool {
				_, body := doRaw(t, "GET", d.base+"/metrics", nil, "")
				return strings.Contains(string(body), "inferd_longpolls_in_flight 1")
			})

			sent := time.Now()
			d.cmd.Process.Signal(syscall.SIGTERM)
			eventually(t, 10*time.Second, "/readyz says not ready while draining", func() bool {
				status, _ := doRaw(t, "GET", d.base+"/readyz", nil, "")
				return status == 503
			})
			if r, err := c.start("mk-drain", `{"i":9}`, false); err != nil || message(r) != "error: server is shutting down; retry shortly" {
				t.Errorf("a start while draining: %v %v, want error: server is shutting down; retry shortly", r, err)
			}
			if r, err := c.check(ids[1], false); err != nil || message(r) != "queued" {
				t.Errorf("a check of the queued call while draining: %v %v, want queued", r, err)
			}
			r := <-polled
			if message(r) != tc.want {
				t.Errorf("the long poll of the running call read %q, want %q: %v", message(r), tc.want, r)
			}
			if tc.want == "success" {
				if i, ok := echoedIndex(r); !ok || i != 0 {
					t.Errorf("the long poll read another call's result: %v", r)
				}
			}
			select {
			case <-d.exited:
			case <-scaledAfter(time.Minute):
				t.Fatal(testenv.Waited(time.Minute, "the daemon to exit after the drain"))
			}
			took := time.Since(sent)
			eventually(t, 20*time.Second, "no model process after shutdown", func() bool { return len(processesWithEnv(mark)) == 0 })

			stored := readDataFile(t, filepath.Join(dir, "data", "inferd.db"))
			if sc := stored[ids[0]]; sc.State != store.CallSucceeded && tc.want == "success" ||
				sc.State != store.CallFailed && tc.want == msgRestart {
				t.Errorf("the running call is stored %s (%q)", sc.State, sc.Message)
			}
			if sc := stored[ids[1]]; sc.State != store.CallQueued {
				t.Errorf("the queued call is stored %s, want queued for the next start", sc.State)
			}

			d = startDaemon(t, dir, cfg)
			c.base = d.base
			for i, want := range []string{tc.want, "success"} {
				r, err := c.final(ids[i])
				if err != nil || message(r) != want {
					t.Errorf("after the restart call %d answers %v %v, want %s", i, r, err, want)
				}
			}
			report(t, "SIGTERM with a %s call running, a long poll on it and a call queued (shutdownTimeout %s): "+
				"the poller read %q, new starts were refused, the daemon exited after %.1fs, the queued call ran after the restart",
				testenv.Scale(callRuns).Round(100*time.Millisecond), tc.shutdownTimeout, message(r), took.Seconds())
		})
	}
}

// TestDiskFull runs the daemon on a small tmpfs, fills it, and checks that
// calls fail with "error: storage full", that what was stored before still
// answers unchanged, and that calls work again once space is freed.
func TestDiskFull(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t, "mounting a tmpfs as the data dir; run `make faults` as root to include this test")
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, noLimits+"startWait: "+scaledSetting(10*time.Second)+"\nlongPollWait: 5s\n")
	data := filepath.Join(dir, "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=16m,mode=0700", "tmpfs", data).CombinedOutput(); err != nil {
		t.Fatalf("mount a tmpfs on %s: %v: %s", data, err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", data).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", data, err, out)
			exec.Command("umount", "-l", data).Run()
		}
	})
	mark := marker()
	d := startDaemon(t, dir, cfg) // registered after the mount: stops before the umount
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("full", "acme", "mk-full", echo, mark, "") + "    minReplicas: 1\n    maxReplicas: 1\n")
	c := faultClient{base: d.base, key: key}

	before := newLedger()
	for i := 0; i < 5; i++ {
		r, err := c.start("mk-full", fmt.Sprintf(`{"i":%d}`, i), false)
		if err != nil || message(r) != "success" {
			t.Fatalf("call %d before the disk filled: %v %v", i, r, err)
		}
		before.add(r["callID"].(string), i)
		before.observe(r["callID"].(string), r)
	}

	// Fill the file system to the last byte.
	filler := filepath.Join(data, "filler")
	f, err := os.Create(filler)
	if err != nil {
		t.Fatal(err)
	}
	chunk := make([]byte, 64<<10)
	for {
		if _, err = f.Write(chunk); err != nil {
			break
		}
	}
	f.Close()
	if !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("filling the tmpfs ended with %v, want ENOSPC", err)
	}

	// Big inputs use up the free pages inside the data file, then the
	// commit needs new ones.
	pad := strings.Repeat("y", 256<<10)
	full := ""
	// A callID answered with an error must keep answering it, after a
	// restart too; one the store could not keep is not handed out.
	fullIDs := map[string]string{}
	for i := 0; i < 100 && full == ""; i++ {
		r, err := c.start("mk-full", fmt.Sprintf(`{"i":%d,"pad":%q}`, 100+i, pad), false)
		if r == nil {
			t.Fatalf("call on a full disk: %v", err)
		}
		switch msg := message(r); {
		case strings.HasPrefix(msg, "error: storage full"):
			full = msg
			if id, _ := r["callID"].(string); id != "" {
				fullIDs[id] = msg
			}
		case msg != "success":
			t.Fatalf("call on a full disk: %q, want success or error: storage full", msg)
		}
	}
	if full == "" {
		t.Fatal("100 calls of 256 KiB on a full 16 MiB tmpfs all succeeded")
	}
	verify(c, before, false)
	before.check(t)
	if status, _ := doRaw(t, "GET", d.base+"/healthz", nil, ""); status != 200 {
		t.Fatalf("healthz on a full disk: %d", status)
	}

	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	r, err := c.start("mk-full", `{"i":999}`, false)
	if err != nil || message(r) != "success" {
		t.Fatalf("a call after space came back: %v %v", r, err)
	}
	verify(c, before, false)
	before.check(t)
	d.stop()
	d = startDaemon(t, dir, cfg)
	c.base = d.base
	for id, want := range fullIDs {
		if r, err := c.check(id, false); err != nil || message(r) != want {
			t.Errorf("call %s answered %q on the full disk, and %v %v after a restart", id, want, r, err)
		}
	}
	d.stop()
	stored := readDataFile(t, filepath.Join(data, "inferd.db"))
	for id, want := range before.index {
		if sc, ok := stored[id]; !ok || sc.State != store.CallSucceeded || inputIndex(sc) != want {
			t.Errorf("call %s stored before the disk filled is now %+v", id, sc)
		}
	}
	report(t, "on a full 16 MiB tmpfs: %q; %d results stored before it filled answer unchanged; calls succeed once space is freed; "+
		"%d callIDs answered with the error (a start whose result could not be saved gets none), each answering it after a restart",
		full, len(before.index), len(fullIDs))
}
