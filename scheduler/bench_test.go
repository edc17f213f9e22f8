package scheduler

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"inferd/store"
)

// benchScheduler runs a scheduler whose replicas are ready at once and
// answer every call at once, over the in-memory store.
func benchScheduler(b *testing.B, p store.Project) *Scheduler {
	return benchSchedulerOn(b, newTestStore(b, p))
}

// benchSchedulerOn is benchScheduler over st.
func benchSchedulerOn(b *testing.B, st *testStore) *Scheduler {
	return benchSchedulerWith(b, st, Config{})
}

// benchSchedulerWith is benchSchedulerOn with cfg.
func benchSchedulerWith(b *testing.B, st *testStore, cfg Config) *Scheduler {
	l := newFakeBackend(64, nil)
	l.auto, l.reply = true, json.RawMessage(`{"ok":true}`)
	s := New(cfg, st, l, RealClock(), zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	b.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			b.Errorf("Run: %v", err)
		}
		st.close()
	})
	return s
}

// cycle submits one call and waits until its result is durable.
func cycle(b *testing.B, s *Scheduler, p store.Project, inputs json.RawMessage) {
	c, err := s.Submit(context.Background(), p, inputs)
	if err != nil {
		b.Errorf("Submit: %v", err) // not Fatal: RunParallel's goroutines call this
		return
	}
	_, done, err := s.Lookup(c.ID)
	if err != nil {
		b.Errorf("Lookup: %v", err)
		return
	}
	<-done
}

// BenchmarkDispatchCycle measures one call's way through the scheduler:
// admission, created write, dispatch, running write, inference on a fake
// replica that answers at once, final write, done.
func BenchmarkDispatchCycle(b *testing.B) {
	p := testProject("bench", minMax(1, 1))
	cycles(b, benchScheduler(b, p), p, nil)
}

// cycles runs one cycle on p, which boots its replica, then setUp (nil:
// none), then the benchmark's loop of cycles.
func cycles(b *testing.B, s *Scheduler, p store.Project, setUp func(inputs json.RawMessage)) {
	inputs := json.RawMessage(`{"x":1}`)
	cycle(b, s, p, inputs)
	if setUp != nil {
		setUp(inputs)
	}
	b.ReportAllocs()
	for b.Loop() {
		cycle(b, s, p, inputs)
	}
}

// BenchmarkDispatchCycleParallel is the same with concurrent callers on
// replicas that take 8 calls each.
func BenchmarkDispatchCycleParallel(b *testing.B) {
	p := testProject("bench", minMax(4, 4), concurrency(8))
	s := benchScheduler(b, p)
	inputs := json.RawMessage(`{"x":1}`)
	cycle(b, s, p, inputs)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			cycle(b, s, p, inputs)
		}
	})
}

// BenchmarkDispatchCycleAmongProjects is BenchmarkDispatchCycle on a box
// that also holds idle projects (no calls, no replicas): what a call costs
// the loop should not grow with them (narrow.go).
func BenchmarkDispatchCycleAmongProjects(b *testing.B) {
	for _, idle := range []int{0, 50, 200} {
		b.Run(fmt.Sprintf("idle=%d", idle), func(b *testing.B) {
			p := testProject("bench", minMax(1, 1))
			projects := []store.Project{p}
			for i := range idle {
				projects = append(projects, testProject(fmt.Sprintf("idle%03d", i), minMax(0, 1)))
			}
			cycles(b, benchSchedulerOn(b, newTestStore(b, projects...)), p, nil)
		})
	}
}

// BenchmarkDispatchCycleBesideABacklog is BenchmarkDispatchCycle for a
// team with quotas whose other project holds a backlog of queued calls
// (the team's replicas quota lets only the benchmark's project boot): a
// team's use is asked on every admission and dispatch, and must not cost
// more with thousands of calls queued (tenancy.go, useOf).
func BenchmarkDispatchCycleBesideABacklog(b *testing.B) {
	for _, backlog := range []int{0, DefaultMaxQueuedPerProject} {
		b.Run(fmt.Sprintf("queued=%d", backlog), func(b *testing.B) {
			p := testProject("bench", minMax(1, 1))
			waiting := testProject("backlog", minMax(0, 1))
			st := newTestStore(b, p, waiting)
			quota := store.Quota{Replicas: 1, RunningCalls: 100, QueuedCalls: 100000}
			if _, err := st.SetTeamQuota(p.TeamID, quota); err != nil {
				b.Fatal(err)
			}
			s := benchSchedulerOn(b, st)
			cycles(b, s, p, func(inputs json.RawMessage) {
				for range backlog {
					if _, err := s.Submit(context.Background(), waiting, inputs); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// BenchmarkDispatchCycleWithATeamQuota is BenchmarkDispatchCycle for a
// team with running-call and replica quotas, on a single box ("box") and
// on a cluster node held to its share of them ("share": Config.TeamShare,
// a lookup under a lock as cluster.Node.TeamShare's cache is, asked at
// each admission and dispatch check): what one set of limits for the
// cluster costs a call on the node's path (docs/benchmarks.md).
func BenchmarkDispatchCycleWithATeamQuota(b *testing.B) {
	quota := store.Quota{Replicas: 2, RunningCalls: 8}
	for _, tc := range []struct {
		name  string
		share func(string) (store.Quota, int64)
	}{
		{"box", nil},
		{"share", func() func(string) (store.Quota, int64) {
			var mu sync.Mutex
			shares := map[string]store.Quota{"team": quota}
			return func(team string) (store.Quota, int64) {
				mu.Lock()
				defer mu.Unlock()
				return shares[team], 1
			}
		}()},
	} {
		b.Run(tc.name, func(b *testing.B) {
			p := testProject("bench", minMax(1, 1))
			st := newTestStore(b, p)
			if _, err := st.SetTeamQuota(p.TeamID, quota); err != nil {
				b.Fatal(err)
			}
			cycles(b, benchSchedulerWith(b, st, Config{TeamShare: tc.share}), p, nil)
		})
	}
}
