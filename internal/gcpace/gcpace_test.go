package gcpace

import (
	"runtime"
	"runtime/debug"
	"testing"
)

// After each collection the pacer lets a small heap grow its headroom, far
// more than GOGC's 100%; a heap larger than the headroom keeps 100%.
func TestGOGCFollowsTheLiveHeap(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	for _, tc := range []struct {
		name     string
		headroom uint64
		atLeast  int
		atMost   int
	}{
		{"small heap", 1 << 30, 1000, 10000},
		{"heap above the headroom", 1, 100, 100},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := make(chan int, 64)
			p := newPacer(tc.headroom)
			p.adjusted = func(pc int) { got <- pc }
			p.adjust()
			<-got
			runtime.GC() // the cleanup runs after this cycle
			pc := <-got
			p.Stop()
			if pc < tc.atLeast || pc > tc.atMost {
				t.Errorf("GOGC after a collection = %d, want %d-%d", pc, tc.atLeast, tc.atMost)
			}
			if now := debug.SetGCPercent(100); now != 100 {
				t.Errorf("GOGC after Stop = %d, want 100", now)
			}
		})
	}
}

func TestGOGCFromTheEnvironmentStands(t *testing.T) {
	if p := Start(1<<30, func(k string) string { return map[string]string{"GOGC": "50"}[k] }); p != nil {
		p.Stop()
		t.Fatal("Start paced the collector although GOGC is set")
	}
}
