//go:build failpoints

package bolt

import (
	"encoding/json"
	"fmt"
	"os"
	"strconv"
	"strings"
	"syscall"

	"inferd/store"
)

// Crash points in the commit path, compiled only into test binaries built
// with -tags failpoints (e2e/faults_test.go builds one). Production builds
// get the no-op in failpoint_off.go.
//
// INFERD_FAILPOINT=<point>[:<n>] makes the process SIGKILL itself the n-th
// time (default: the first) a group commit reaches <point>:
//
//	call-before    a batch holding a newly queued call, before its commit
//	call-after     the same, after its commit but before anyone is told
//	result-before  a batch holding a final result, before its commit
//	result-after   the same, after its commit but before anyone is told
//	call-apply-before, result-apply-before
//	               the same writes once logged (durable, and their callers
//	               told), before the applier copies them into the data file;
//	               n counts writes of the kind, not batches (the applier
//	               takes whatever was logged for up to applyLinger)
//	call-apply-after, result-apply-after
//	               after that copy has committed, before the log segments
//	               it made redundant are removed
//
// SIGKILL, not os.Exit: no deferred function, no buffered write, no signal
// handler of the daemon runs, exactly as when the machine loses power
// (minus the page cache, which fdatasync has already flushed).
var failpointName, failpointAt = parseFailpoint(os.Getenv("INFERD_FAILPOINT"))

// failpointHits counts hits of the armed point. Only the writer goroutine
// (or, for the apply points, only the applier) touches it.
var failpointHits int

func parseFailpoint(v string) (string, int) {
	name, n, found := strings.Cut(v, ":")
	if !found {
		return name, 1
	}
	at, err := strconv.Atoi(n)
	if err != nil || at < 1 {
		panic(fmt.Sprintf("INFERD_FAILPOINT=%q: the count after ':' must be a positive integer", v))
	}
	return name, at
}

// commitFailpoint is called by the writer goroutine with stage "before" or
// "after" around each group commit.
func commitFailpoint(stage string, batch []callWrite) {
	if failpointName == "" || !strings.HasSuffix(failpointName, "-"+stage) {
		return
	}
	kind := strings.TrimSuffix(failpointName, "-"+stage)
	if !batchHolds(kind, batch) {
		return
	}
	failpointHits++
	if failpointHits < failpointAt {
		return
	}
	fmt.Fprintf(os.Stderr, "inferd failpoint %s reached: killing the process\n", failpointName)
	_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {} // the signal is on its way; nothing more may be written
}

// applyFailpoint is called by the applier with stage "before" or "after"
// around each transaction that copies logged writes into the data file.
func applyFailpoint(stage string, batch []*logged) {
	if failpointName == "" || !strings.HasSuffix(failpointName, "-apply-"+stage) {
		return
	}
	kind := strings.TrimSuffix(failpointName, "-apply-"+stage)
	for _, l := range batch {
		if batchHolds(kind, []callWrite{l.cw}) {
			failpointHits++
		}
	}
	if failpointHits >= failpointAt {
		fmt.Fprintf(os.Stderr, "inferd failpoint %s reached: killing the process\n", failpointName)
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// batchHolds reports whether batch has a write of kind: "call" is a call
// written in state queued, "result" a call in a final state.
func batchHolds(kind string, batch []callWrite) bool {
	for _, cw := range batch {
		switch {
		case kind == "result" && cw.final:
			return true
		case kind == "call" && !cw.final:
			var c struct{ State store.CallState }
			if json.Unmarshal(cw.value, &c) == nil && c.State == store.CallQueued {
				return true
			}
		}
	}
	return false
}
