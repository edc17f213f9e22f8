package testenv

import (
	"testing"
	"time"
)

// WaitBound is how long WaitFor polls on a quiet machine before it fails
// the test; Scale stretches it on a busy one.
const WaitBound = 15 * time.Second

// WaitFor polls cond, 20 ms after each try, until it holds, and fails t if it has not
// within Scale(WaitBound), saying what it waited for and how loaded the
// machine was. It is for state another process or goroutine changes with
// no signal to wait on (a process that exits, a file that appears, an etcd
// watch that lands); the bound only ends a test that would hang.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	Eventually(t, WaitBound, what, cond)
}

// Eventually is WaitFor with a bound of its own: d on a quiet machine,
// Scale(d) on a busy one.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(Scale(d))
	// The pause counts from the end of each try, not a fixed tick: a cond
	// that is slow on a busy machine (a scan of /proc, an HTTP request)
	// never runs back to back and adds to the load it waits out.
	pause := time.NewTimer(0)
	defer pause.Stop()
	<-pause.C
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal(Waited(d, what))
		}
		pause.Reset(20 * time.Millisecond)
		<-pause.C
	}
}
