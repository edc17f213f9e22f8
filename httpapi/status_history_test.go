package httpapi

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"inferd/gpu"
	"inferd/history"
	"inferd/httpapi/status"
	"inferd/scheduler"
	"inferd/store"
)

// fakeHistory serves fixed samples.
type fakeHistory []history.Sample

func (f fakeHistory) Samples(context.Context) ([]history.Sample, error) { return f, nil }
func (fakeHistory) Interval() time.Duration                             { return 5 * time.Second }

func latencies(ms ...int) history.Latencies {
	l := history.Latencies{}
	for _, m := range ms {
		l.Add(time.Duration(m) * time.Millisecond)
	}
	return l
}

func TestStatusHistoryShowsTheCallersProjectsAndEveryGPU(t *testing.T) {
	devs := gpu.Simulated([]gpu.SimulatedGPU{{Name: "Sim A", MemoryMiB: 1024}, {Name: "Sim B", MemoryMiB: 2048}}).Devices()
	t0 := statusNow.Add(-10 * time.Second)
	samples := fakeHistory{
		{At: t0, Interval: 5 * time.Second, GPUs: devs[:1], Reserved: map[string]uint64{devs[0].UUID: 256},
			Projects: []history.ProjectSample{
				{ID: "echo", TeamID: "acme", Succeeded: 10, Failed: 5, Queued: 2, Latency: latencies(100, 100, 100, 400)},
				{ID: "hidden", TeamID: "other", Succeeded: 50, Queued: 7, Latency: latencies(9000)},
			}},
		{At: t0.Add(5 * time.Second), Interval: 5 * time.Second, GPUs: devs, Reserved: map[string]uint64{devs[1].UUID: 2048}},
	}
	env := newEnv(t, Options{Status: &status.Sources{
		GPUs:    func() []gpu.Device { return devs },
		History: samples,
	}})
	apiErrorReply(t, serve(env.h, "GET", "/v1/status/history", ""), http.StatusUnauthorized, codeUnauthorized)

	rec := serve(env.h, "GET", "/v1/status/history", "", "X-Service-API-Key", keyAcme)
	got := decode[status.Charts](t, rec)
	if got.IntervalSeconds != 5 || len(got.Points) != 2 {
		t.Fatalf("history = %s", rec.Body)
	}
	p := got.Points[0]
	if !p.Time.Equal(t0) || p.SucceededPerSec != 2 || p.FailedPerSec != 1 || p.Queued != 2 {
		t.Errorf("acme's first point = %+v, want 2/s succeeded, 1/s failed, 2 queued (not other's)", p)
	}
	if p.LatencyP50 == nil || *p.LatencyP50 < 90 || *p.LatencyP50 > 110 || p.LatencyP95 == nil || *p.LatencyP95 < 360 || *p.LatencyP95 > 440 {
		t.Errorf("acme's latency p50 %v p95 %v, want about 100 and 400 ms", p.LatencyP50, p.LatencyP95)
	}
	if q := got.Points[1]; q.SucceededPerSec != 0 || q.LatencyP50 != nil || q.Queued != 0 {
		t.Errorf("a quiet interval = %+v", q)
	}
	if len(got.GPUs) != 2 {
		t.Fatalf("gpus = %+v", got.GPUs)
	}
	// Simulated GPUs: used is the reservation. GPU 1 was not in the first
	// sample: null there.
	if g := got.GPUs[0]; g.Name != "Sim A" || g.MemoryTotalBytes != 1<<30 || *g.MemoryUsedBytes[0] != 256<<20 || *g.MemoryUsedBytes[1] != 0 {
		t.Errorf("GPU 0 = %+v", g)
	}
	if g := got.GPUs[1]; g.MemoryUsedBytes[0] != nil || *g.MemoryUsedBytes[1] != 2<<30 {
		t.Errorf("GPU 1 = %+v", g)
	}

	all := decode[status.Charts](t, serve(env.h, "GET", "/v1/status/history/", "", "X-Service-API-Key", keyAdmin))
	if p := all.Points[0]; p.SucceededPerSec != 12 || p.Queued != 9 || *p.LatencyP95 < 8000 {
		t.Errorf("admin's first point = %+v, want both teams", p)
	}
}

func TestStatusHistoryOffWithoutARecorder(t *testing.T) {
	env := newEnv(t, Options{Status: &status.Sources{}})
	if rec := serve(env.h, "GET", "/v1/status/history", "", "X-Service-API-Key", keyAcme); rec.Code != http.StatusNotFound {
		t.Errorf("GET /v1/status/history without a recorder: %d", rec.Code)
	}
}

// TestStatusProjectExplainsWaitsAndFailures: the facts the page orders
// projects by and links a failed boot's log from, the waits spelled out,
// and latencies only over calls that reached a replica.
func TestStatusProjectExplainsWaitsAndFailures(t *testing.T) {
	failedAt := statusNow.Add(-2 * time.Minute)
	devs := gpu.Simulated([]gpu.SimulatedGPU{{Name: "Sim A"}, {Name: "Sim B"}}).Devices()
	snap := scheduler.Status{CPUSlots: 2, CPUSlotsUsed: 2,
		GPUs: []scheduler.GPUStatus{{UUID: devs[0].UUID, Replicas: []string{"x-1"}}, {UUID: devs[1].UUID, Replicas: []string{}}},
		Projects: []scheduler.ProjectStatus{
			{ID: "echo", TeamID: "acme", Queued: 1, Waiting: scheduler.WaitingCPU,
				LastError: "model failed to start: no module named torch", LastErrorAt: failedAt, LastErrorReplica: "echo-3"},
			{ID: "zeta", TeamID: "acme", Queued: 1, Waiting: scheduler.WaitingGPU},
		}}
	at := func(ago time.Duration) time.Time { return statusNow.Add(-ago) }
	calls := fakeCalls{
		// A failed boot: never dispatched, an hour in the queue.
		{ID: "c1", ProjectID: "echo", TeamID: "acme", State: store.CallFailed, Created: at(time.Hour), Finished: at(time.Minute)},
		{ID: "c2", ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded, Created: at(time.Minute), Dispatched: at(time.Minute), Finished: at(time.Minute - 40*time.Millisecond)},
		// A model error an hour ago: no longer recent.
		{ID: "c3", ProjectID: "echo", TeamID: "acme", State: store.CallFailed, Created: at(2 * time.Hour), Dispatched: at(2 * time.Hour), Finished: at(time.Hour)},
	}
	env := newEnv(t, Options{Status: &status.Sources{
		Snapshot: func() scheduler.Status { return snap },
		GPUs:     func() []gpu.Device { return devs },
		Calls:    calls,
		Now:      func() time.Time { return statusNow },
	}})
	zeta := testProject("zeta", "acme")
	zeta.Model.GPUs = 2
	env.store.addProject(t, zeta, "mk-zeta")

	got := decode[status.Results[status.Project]](t, serve(env.h, "GET", "/v1/status/projects", "", "X-Service-API-Key", keyAcme)).Results
	echo := got[0]
	if echo.Waiting != "waiting for CPU slot: 2 of 2 in use, see cpuSlots" {
		t.Errorf("echo waiting = %q", echo.Waiting)
	}
	if echo.LastErrorReplica != "echo-3" || echo.LastErrorAt == nil || !echo.LastErrorAt.Equal(failedAt) || echo.RecentFailures != 1 {
		t.Errorf("echo: last error of %q at %v, %d recent failures; want echo-3 at %v, 1", echo.LastErrorReplica, echo.LastErrorAt, echo.RecentFailures, failedAt)
	}
	// c2 (40 ms) and c3 (an hour, but it ran): c1's hour in a failed boot is left out.
	if echo.Finished != 2 || *echo.LatencyP50 != 40 {
		t.Errorf("echo latency over %d calls, p50 %v; want 2 calls, 40 ms", echo.Finished, *echo.LatencyP50)
	}
	if z := got[1]; !strings.HasPrefix(z.Waiting, "waiting for GPU: needs 2 per replica, 1 of 2 GPUs held") || z.LastErrorAt != nil {
		t.Errorf("zeta waiting = %q, last error at %v", z.Waiting, z.LastErrorAt)
	}
}
