package e2e

import (
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestDefaultBacklogModelServesItsConcurrency: a model that listens with
// Python's default backlog (ThreadingHTTPServer: 5 connections waiting to be
// accepted) and declares concurrency 64 gets 64 calls at once, so the
// daemon opens 64 connections to it at once, more than its backlog holds:
// the kernel drops the connects it has no room for and the client's SYN is
// sent again only after a second. No call may fail for it: nothing was sent
// on a connect that failed or timed out, so the daemon tries again within
// the call's deadline (docs/protocols.md, "Connecting to a replica").
func TestDefaultBacklogModelServesItsConcurrency(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, noLimits)
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("wide", "acme", "mk-wide", echo, marker(), "") +
		"    concurrency: 64\n    minReplicas: 1\n    maxReplicas: 1\n    inferenceTimeout: 60\n")
	eventually(t, time.Minute, "replica ready", func() bool {
		return slices.Equal(d.replicaStates(key, "wide"), []string{"ready"})
	})
	c := inferenceClient{t: t, base: d.base, key: key}
	const calls = 64
	for round := range 2 { // the second finds the connections the first opened
		var wg sync.WaitGroup
		msgs := make([]string, calls)
		for i := range calls {
			wg.Add(1)
			go func() {
				defer wg.Done()
				// Each call holds its connection a while, so all 64 are open at once.
				r, err := c.tryStart("mk-wide", fmt.Sprintf(`{"sleep":0.3,"n":%d}`, i), false)
				switch {
				case err != nil:
					msgs[i] = err.Error()
				case r["message"] != "success":
					msgs[i] = fmt.Sprint(r["message"])
				}
			}()
		}
		wg.Wait()
		for i, m := range msgs {
			if m != "" {
				t.Errorf("round %d, call %d of %d at once: %s", round, i, calls, m)
			}
		}
	}
}
