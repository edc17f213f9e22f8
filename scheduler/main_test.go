package scheduler

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// settleBoundEnv overrides settleBound (a Go duration), for the test that
// proves the bound with a deliberate live-lock.
const settleBoundEnv = "INFERD_SETTLE_BOUND"

// settleBound is how long, in real time, one harness settle may wait. A
// healthy settle returns in milliseconds, even under -race on a loaded box;
// one that has not returned by then is waiting on a live-locked loop (a
// goroutine that never blocks), which synctest.Wait would wait on forever.
const settleBound = 10 * time.Second

// TestMain runs the settle watchdog beside the tests: it lives outside every
// synctest bubble, so its clock is real time, which no bubble's can be.
func TestMain(m *testing.M) {
	bound := settleBound
	if v := os.Getenv(settleBoundEnv); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			fmt.Fprintf(os.Stderr, "%s=%q: want a positive Go duration\n", settleBoundEnv, v)
			os.Exit(2)
		}
		bound = d
	}
	quit, stopped := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(stopped)
		watch.run(bound, quit)
	}()
	code := m.Run()
	close(quit)
	<-stopped
	os.Exit(code)
}

// settleWatchdog fails the run when one settle outlasts the bound. The
// harness's settle reports its start and end; the watchdog polls.
type settleWatchdog struct {
	mu   sync.Mutex
	test string // the test inside settle now; "" when none is
	gen  uint64 // counts settles begun, to tell one long settle from many short ones
}

// watch is the one watchdog of the test binary (tests here never run in
// parallel, so one settle at a time).
var watch settleWatchdog

func (w *settleWatchdog) begin(test string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.gen++
	w.test = test
}

func (w *settleWatchdog) end() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.test = ""
}

// run polls until quit is closed. A settle seen in progress for bound ends
// the test binary with a panic naming the test, with every goroutine's stack
// (the live-locked one among them), as the testing package does on -timeout.
func (w *settleWatchdog) run(bound time.Duration, quit <-chan struct{}) {
	tick := time.NewTicker(bound / 20)
	defer tick.Stop()
	var seen uint64
	var since time.Time
	for {
		var now time.Time
		select {
		case <-quit:
			return
		case now = <-tick.C:
		}
		w.mu.Lock()
		test, gen := w.test, w.gen
		w.mu.Unlock()
		if test == "" || gen != seen {
			seen, since = gen, now
			continue
		}
		if now.Sub(since) >= bound {
			debug.SetTraceback("all")
			panic(fmt.Sprintf("%s: the harness's settle has not returned after %v: a goroutine of the scheduler never blocks (a live-lock?); stacks follow", test, bound))
		}
	}
}

// helperEnv makes TestSettleLiveLockHelper live-lock (see below).
const helperEnv = "INFERD_SCHEDULER_TEST_HELPER"

// TestSettleFailsALiveLockInSeconds runs a test binary whose harness
// live-locks and checks that the watchdog ends it within seconds, naming the
// test, instead of leaving it to the package's -timeout.
func TestSettleFailsALiveLockInSeconds(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestSettleLiveLockHelper$", "-test.count=1")
	cmd.Env = append(os.Environ(), helperEnv+"=livelock", settleBoundEnv+"=1s")
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("the live-locked test binary was still running after 2 minutes:\n%s", tail(out))
	}
	if err == nil {
		t.Fatalf("the live-locked test binary passed:\n%s", tail(out))
	}
	want := "TestSettleLiveLockHelper: the harness's settle has not returned after 1s"
	if !strings.Contains(string(out), want) {
		t.Fatalf("output lacks %q:\n%s", want, tail(out))
	}
}

// TestSettleLiveLockHelper is the helper process of
// TestSettleFailsALiveLockInSeconds: a goroutine of the bubble spins forever,
// so settle can never return.
func TestSettleLiveLockHelper(t *testing.T) {
	if os.Getenv(helperEnv) != "livelock" {
		t.Skip("helper process of TestSettleFailsALiveLockInSeconds")
	}
	synctest.Test(t, func(t *testing.T) {
		h := newHarness(t, Config{}, nil)
		go func() {
			for {
				runtime.Gosched()
			}
		}()
		h.settle()
		t.Error("settle returned while a goroutine spins")
	})
}

func tail(out []byte) []byte {
	if len(out) > 4000 {
		return out[len(out)-4000:]
	}
	return out
}
