package history

import (
	"context"
	"errors"
	"math"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"inferd/gpu"
	"inferd/scheduler"
	"inferd/store"
)

func TestSamplesEachIntervalAndKeepsOnlyTheWindow(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var queued atomic.Int64 // changed by the test, read by Run
		queued.Store(3)
		devs := []gpu.Device{{Index: 0, UUID: "GPU-a", MemoryTotalMiB: 1024, MemoryFreeMiB: 256}}
		r := New(Sources{
			Snapshot: func() scheduler.Status {
				return scheduler.Status{
					Projects: []scheduler.ProjectStatus{{ID: "busy", TeamID: "acme", Queued: int(queued.Load())}, {ID: "idle", TeamID: "acme"}},
					GPUs:     []scheduler.GPUStatus{{UUID: "GPU-a", ReservedMiB: 512}},
				}
			},
			GPUs: func() []gpu.Device { return devs },
		}, 5*time.Second, 15*time.Second)
		ctx, cancel := context.WithCancel(t.Context())
		ran := make(chan error, 1)
		go func() { ran <- r.Run(ctx) }()

		start := time.Now()
		r.CallFinished(call("echo", store.CallSucceeded, 100*time.Millisecond, true))
		r.CallFinished(call("echo", store.CallSucceeded, 300*time.Millisecond, true))
		r.CallFinished(call("echo", store.CallFailed, 200*time.Millisecond, true))
		// A call that never reached a replica counts as failed but has no
		// latency: a failed boot says nothing about the model's speed.
		r.CallFinished(call("echo", store.CallFailed, 30*time.Minute, false))

		if got := samples(t, r); len(got) != 0 {
			t.Fatalf("samples before the first tick: %+v", got)
		}
		time.Sleep(5 * time.Second)
		synctest.Wait()
		got := samples(t, r)
		if len(got) != 1 {
			t.Fatalf("after one interval: %d samples", len(got))
		}
		s := got[0]
		if !s.At.Equal(start.Add(5*time.Second)) || s.Interval != 5*time.Second {
			t.Errorf("sample at %v over %v, want %v over 5s", s.At, s.Interval, start.Add(5*time.Second))
		}
		if len(s.Projects) != 2 || s.Projects[0].ID != "busy" || s.Projects[1].ID != "echo" {
			t.Fatalf("projects %+v, want busy (queued) and echo (finished calls), by id; idle has neither", s.Projects)
		}
		if b := s.Projects[0]; b.Queued != 3 || b.TeamID != "acme" || b.Succeeded+b.Failed != 0 {
			t.Errorf("busy = %+v", b)
		}
		e := s.Projects[1]
		if e.Succeeded != 2 || e.Failed != 2 || e.TeamID != "acme" || e.Latency.Count() != 3 {
			t.Errorf("echo = %+v, want 2 succeeded, 2 failed, 3 latencies", e)
		}
		if p95, _ := e.Latency.Quantile(0.95); !near(p95, 300*time.Millisecond) {
			t.Errorf("echo p95 = %v, want about 300ms (not the 30 min failed boot)", p95)
		}
		if len(s.GPUs) != 1 || s.GPUs[0].UUID != "GPU-a" || s.Reserved["GPU-a"] != 512 {
			t.Errorf("GPUs %+v reserved %v", s.GPUs, s.Reserved)
		}

		// The next interval starts from zero; after the window only the
		// newest three are kept.
		queued.Store(0)
		time.Sleep(5 * time.Second)
		synctest.Wait()
		if got := samples(t, r); len(got) != 2 || len(got[1].Projects) != 0 {
			t.Fatalf("second sample: %+v", got[len(got)-1])
		}
		time.Sleep(10 * time.Second)
		synctest.Wait()
		got = samples(t, r)
		if len(got) != 3 || !got[0].At.Equal(start.Add(10*time.Second)) || !got[2].At.Equal(start.Add(20*time.Second)) {
			t.Errorf("kept %d samples from %v, want 3 from %v", len(got), got[0].At, start.Add(10*time.Second))
		}

		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run = %v", err)
		}
		if _, err := r.Samples(t.Context()); !errors.Is(err, ErrStopped) {
			t.Errorf("Samples after Run returned: %v, want ErrStopped", err)
		}
	})
}

func TestSamplesWaitsForRunOrTheCaller(t *testing.T) {
	r := New(Sources{}, time.Second, time.Minute)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	if _, err := r.Samples(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Samples with Run not started and the caller gone: %v", err)
	}
}

func TestLatencyQuantilesAreWithinTenPercent(t *testing.T) {
	for _, tc := range []struct {
		name string
		ms   []float64
		q    float64
		want float64
	}{
		{"one call", []float64{120}, 0.5, 120},
		{"sub-millisecond", []float64{0.2, 0.4}, 0.5, 1},
		{"p50 of 1..100", seq(1, 100), 0.5, 50},
		{"p95 of 1..100", seq(1, 100), 0.95, 95},
		{"p95 of a slow tail", append(seq(10, 10), 5000), 0.95, 5000},
		{"a day", []float64{86_400_000}, 0.5, 86_400_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l := Latencies{}
			for _, ms := range tc.ms {
				l.Add(time.Duration(ms * float64(time.Millisecond)))
			}
			got, ok := l.Quantile(tc.q)
			want := time.Duration(tc.want * float64(time.Millisecond))
			if !ok || !near(got, want) {
				t.Errorf("q%v = %v (%v), want %v ± 10%%", tc.q, got, ok, want)
			}
		})
	}
	if _, ok := (Latencies{}).Quantile(0.5); ok {
		t.Error("an empty Latencies has a quantile")
	}
	a, b := Latencies{}, Latencies{}
	a.Add(10 * time.Millisecond)
	b.Add(1000 * time.Millisecond)
	b.Add(1000 * time.Millisecond)
	a.Merge(b)
	if got, _ := a.Quantile(0.5); a.Count() != 3 || !near(got, time.Second) {
		t.Errorf("merged: count %d, p50 %v", a.Count(), got)
	}
}

func call(project string, state store.CallState, took time.Duration, dispatched bool) store.Call {
	now := time.Now()
	c := store.Call{ProjectID: project, TeamID: "acme", State: state, Created: now.Add(-took), Finished: now}
	if dispatched {
		c.Dispatched = c.Created
	}
	return c
}

func samples(t *testing.T, r *Recorder) []Sample {
	t.Helper()
	s, err := r.Samples(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func seq(from, n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = float64(from + i)
	}
	return out
}

func near(got, want time.Duration) bool {
	return math.Abs(float64(got-want)) <= 0.1*float64(want)
}
