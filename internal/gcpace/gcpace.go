// Package gcpace paces the Go garbage collector for a daemon whose live heap
// is small and whose every call allocates: with GOGC's default of 100 the
// heap may only double before the next collection, so a daemon that keeps a
// few MiB live collects several times a second under load, and collection
// was 8% of inferd's CPU at concurrency 64 (docs/benchmarks.md). Start lets
// the heap grow a fixed headroom past what the last collection left live,
// or by GOGC's 100% when that is more: a small heap is collected less often,
// a large one exactly as before, so the peak memory of large payloads and
// many long polls does not change.
package gcpace

import (
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync/atomic"
)

// sentinel is allocated after each collection, with a cleanup that runs
// once the next collection finds it unreachable: a hook at the end of every
// cycle. It holds a pointer so that it is never one of the tiny allocator's
// shared blocks, which are freed together.
type sentinel struct{ _ *int }

// Pacer keeps GOGC at the percentage that gives the heap its headroom,
// adjusted after every collection, until Stop.
type Pacer struct {
	headroom uint64
	stopped  atomic.Bool
	sample   []metrics.Sample
	// adjusted, when set, is told each percentage chosen (for tests).
	adjusted func(percent int)
}

// Start begins pacing with headroom bytes above the live heap. It does
// nothing, and returns nil, when the environment sets GOGC: the operator's
// choice stands.
func Start(headroom uint64, getenv func(string) string) *Pacer {
	if getenv("GOGC") != "" {
		return nil
	}
	p := newPacer(headroom)
	p.adjust()
	return p
}

func newPacer(headroom uint64) *Pacer {
	return &Pacer{headroom: headroom, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
}

// Stop ends the pacing and restores GOGC's default; nil is a no-op.
func (p *Pacer) Stop() {
	if p == nil || p.stopped.Swap(true) {
		return
	}
	debug.SetGCPercent(100)
}

// adjust sets GOGC for the live heap the last collection left and arms the
// hook for the next one. It runs on the runtime's cleanup goroutine, one at
// a time.
func (p *Pacer) adjust() {
	if p.stopped.Load() {
		return
	}
	metrics.Read(p.sample)
	percent := 100
	if live := p.sample[0].Value.Uint64(); live > 0 && p.headroom*100/live > 100 {
		percent = int(min(p.headroom*100/live, 10000))
	}
	debug.SetGCPercent(percent)
	if p.adjusted != nil {
		p.adjusted(percent)
	}
	runtime.AddCleanup(&sentinel{}, func(p *Pacer) { p.adjust() }, p)
}
