package testenv

import (
	"testing"
	"time"
)

// WaitBound is how long WaitFor polls before it fails the test.
const WaitBound = 15 * time.Second

// WaitFor polls cond every 10 ms until it holds, and fails t if it has not
// within WaitBound. It is for state another process or goroutine changes
// with no signal to wait on (a process that exits, a file that appears, an
// etcd watch that lands); the bound only ends a test that would hang.
func WaitFor(t testing.TB, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(WaitBound)
	tick := time.NewTicker(10 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", WaitBound, what)
		}
		<-tick.C
	}
}
