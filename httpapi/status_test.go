package httpapi

import (
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/gpu"
	"inferd/httpapi/status"
	"inferd/scheduler"
	"inferd/scheduler/backend"
	"inferd/scheduler/backend/local"
	"inferd/store"
)

// fakeCalls is a status.RecentCalls over a fixed list, newest first.
type fakeCalls []store.Call

func (f fakeCalls) RecentCalls(teamID string, limit int) ([]store.Call, error) {
	var out []store.Call
	for _, c := range f {
		if (teamID == "" || c.TeamID == teamID) && len(out) < limit {
			out = append(out, c)
		}
	}
	return out, nil
}

var statusNow = time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)

// newStatusEnv serves two simulated GPUs, one held by acme's echo-1 and one
// by other's hidden-1, finished calls of both teams, and replica logs.
// queuedETA is the estimate of the queued call c4 in newStatusEnv.
var queuedETA = int64(1800)

func newStatusEnv(t *testing.T) (*testEnv, string) {
	t.Helper()
	logDir := t.TempDir()
	// echo-7 ran when echo belonged to team other; acme must not see it.
	for _, l := range []struct{ team, id string }{{"acme", "echo-1"}, {"other", "hidden-1"}, {"other", "echo-7"}} {
		id := l.id
		project, _, _ := strings.Cut(id, "-")
		p := local.LogPath(logDir, l.team, project, id)
		os.MkdirAll(filepath.Dir(p), 0o755)
		if err := os.WriteFile(p, []byte("booting "+id+"\nlistening\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	logs := local.LogDir(logDir)
	devs := gpu.Simulated([]gpu.SimulatedGPU{{Name: "Sim A"}, {Name: "Sim B", MemoryMiB: 1024}}).Devices()
	snap := scheduler.Status{Projects: []scheduler.ProjectStatus{
		{ID: "echo", TeamID: "acme", Queued: 2, Running: 1, LastError: "model failed to start: boom", OOMKills: 2, Batches: 4, MeanBatchSize: 2.5,
			Queue: []scheduler.QueuedCall{{ID: "c4", QueuePosition: 0, ETAMs: &queuedETA,
				WaitingFor: &store.Wait{Code: scheduler.WaitReplicasBusy, Text: "its replica busy (next free in ~0.8 s)"}}},
			Replicas: []scheduler.ReplicaStatus{{ID: "echo-1", State: "busy", Pid: 4242, GPUs: []string{devs[0].UUID},
				Started: statusNow.Add(-90 * time.Second), InFlight: 1}}},
		{ID: "hidden", TeamID: "other",
			Replicas: []scheduler.ReplicaStatus{{ID: "hidden-1", State: "ready", Pid: 777, GPUs: []string{devs[1].UUID},
				Started: statusNow.Add(-time.Hour), IdleExpiry: statusNow.Add(30 * time.Second)}}},
	}, GPUs: []scheduler.GPUStatus{
		{UUID: devs[0].UUID, ReservedMiB: 16384, Replicas: []string{"echo-1"}}, // a whole GPU
		{UUID: devs[1].UUID, ReservedMiB: 512, Replicas: []string{"hidden-1"}}, // a share
	}}
	var calls fakeCalls
	call := func(id, project, team string, state store.CallState, totalMs int) {
		c := store.Call{ID: id, ProjectID: project, TeamID: team, State: state,
			Inputs: json.RawMessage(`{"secret":"input-` + id + `"}`), Outputs: json.RawMessage(`{"secret":"output"}`),
			Created: statusNow.Add(-time.Minute)}
		if state.Done() {
			c.Dispatched = c.Created.Add(time.Millisecond)
			c.Finished = c.Created.Add(time.Duration(totalMs) * time.Millisecond)
			c.QueueMs, c.RunMs = 1, int64(totalMs-1)
		}
		if state == store.CallFailed {
			c.Message = "error: model returned HTTP 500"
		}
		calls = append(calls, c)
	}
	call("c5", "hidden", "other", store.CallSucceeded, 5000)
	call("c4", "echo", "acme", store.CallQueued, 0)
	for i, ms := range []int{10, 20, 30, 40, 1000} {
		state := store.CallSucceeded
		if i == 4 {
			state = store.CallFailed
		}
		call("c3-"+string(rune('a'+i)), "echo", "acme", state, ms)
	}
	env := newEnv(t, Options{Status: &status.Sources{
		Snapshot: func() scheduler.Status { return snap },
		GPUs:     func() []gpu.Device { return devs },
		Calls:    calls,
		Logs:     logs,
		Now:      func() time.Time { return statusNow },
		Protections: func() []backend.Protection {
			return []backend.Protection{{Name: backend.ProtectionIdentity, On: true, Detail: "a uid per project"}, {Name: backend.ProtectionNetwork, Detail: "host"}}
		},
	}})
	return env, logDir
}

func TestStatusNeedsAKey(t *testing.T) {
	env, _ := newStatusEnv(t)
	for _, path := range []string{"/v1/status", "/v1/status/gpus", "/v1/status/projects", "/v1/status/calls",
		"/v1/status/projects/echo/replicas/echo-1/logs", "/v1/status/usage", "/v1/usage"} {
		apiErrorReply(t, serve(env.h, "GET", path, ""), http.StatusUnauthorized, codeUnauthorized)
		apiErrorReply(t, serve(env.h, "GET", path, "", "X-Service-API-Key", "ik_nope"), http.StatusUnauthorized, codeUnauthorized)
		apiErrorReply(t, serve(env.h, "GET", path, "", "X-Service-API-Key", keyRevoked), http.StatusUnauthorized, codeUnauthorized)
	}
}

func TestStatusTeamSeesOnlyItsOwn(t *testing.T) {
	env, _ := newStatusEnv(t)
	rec := serve(env.h, "GET", "/v1/status", "", "X-BANANA-API-KEY", keyAcme)
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	if strings.Contains(rec.Body.String(), "hidden") || strings.Contains(rec.Body.String(), "secret") {
		t.Fatalf("a team sees another team's project or call inputs/outputs:\n%s", rec.Body)
	}
	st := decode[status.All](t, rec)
	var ids []string
	for _, p := range st.Projects {
		ids = append(ids, p.ID)
	}
	if !slices.Equal(ids, []string{"echo", "zeta"}) {
		t.Errorf("projects %v, want [echo zeta]", ids)
	}
	if len(st.GPUs) != 2 {
		t.Fatalf("gpus %+v", st.GPUs)
	}
	if g := st.GPUs[0]; !g.Held || g.HeldBy == nil || *g.HeldBy != (status.ReplicaName{Project: "echo", Replica: "echo-1"}) {
		t.Errorf("GPU 0 holder %+v, want acme's echo-1", g)
	}
	if g := st.GPUs[1]; !g.Held || g.HeldBy != nil || g.MemoryTotalBytes != 1<<30 || g.Name != "Sim B" {
		t.Errorf("GPU 1 = %+v, want held by someone unnamed, 1 GiB", g)
	}
	// Simulated GPUs have no driver: used memory is what inferd reserved.
	for i, want := range []uint64{16 << 30, 512 << 20} {
		if g := st.GPUs[i]; g.MemoryReservedBytes != want || g.MemoryUsedBytes != want || g.UtilizationPct != 0 {
			t.Errorf("GPU %d memory used %d, reserved %d, utilization %d%%; want %d reserved and used, 0%%",
				i, g.MemoryUsedBytes, g.MemoryReservedBytes, g.UtilizationPct, want)
		}
	}
	var callIDs []string
	for _, c := range st.Calls {
		callIDs = append(callIDs, c.ID)
	}
	if want := []string{"c4", "c3-a", "c3-b", "c3-c", "c3-d", "c3-e"}; !slices.Equal(callIDs, want) {
		t.Errorf("calls %v, want %v", callIDs, want)
	}
	if st.Scope != store.ScopeTeam || st.TeamID != "acme" {
		t.Errorf("scope %q team %q", st.Scope, st.TeamID)
	}
	if len(st.Protections) != 2 || !st.Protections[0].On || st.Protections[1].On || st.Protections[1].Detail != "host" {
		t.Errorf("protections %+v, want the sandbox's, on and off", st.Protections)
	}
}

func TestStatusAdminSeesAll(t *testing.T) {
	env, _ := newStatusEnv(t)
	st := decode[status.All](t, serve(env.h, "GET", "/v1/status/", "", "X-Service-API-Key", keyAdmin))
	if len(st.Projects) != 3 || len(st.Calls) != 7 {
		t.Errorf("admin sees %d projects, %d calls; want 3, 7", len(st.Projects), len(st.Calls))
	}
	if g := st.GPUs[1]; g.HeldBy == nil || g.HeldBy.Replica != "hidden-1" {
		t.Errorf("admin does not see GPU 1's holder: %+v", g)
	}
}

func TestStatusProjectFigures(t *testing.T) {
	env, _ := newStatusEnv(t)
	got := decode[status.Results[status.Project]](t, serve(env.h, "GET", "/v1/status/projects", "", "X-Service-API-Key", keyAcme))
	echo := got.Results[0]
	// Latencies 10, 20, 30, 40, 1000 ms (the queued call has none): nearest rank.
	if echo.LatencyP50 == nil || *echo.LatencyP50 != 30 || echo.LatencyP95 == nil || *echo.LatencyP95 != 1000 || echo.Finished != 5 {
		t.Errorf("latency p50 %v p95 %v over %d", echo.LatencyP50, echo.LatencyP95, echo.Finished)
	}
	if echo.Queued != 2 || echo.Running != 1 || echo.LastError != "model failed to start: boom" || echo.MaxReplicas != 3 || echo.OOMKills != 2 {
		t.Errorf("echo = %+v", echo)
	}
	if echo.Batches != 4 || echo.MeanBatchSize != 2.5 || echo.BatchMaxSize != 0 {
		t.Errorf("echo's batches: %d of %.1f calls on average, maxSize %d; want 4 of 2.5 from the scheduler, and no maxSize (it does not batch)",
			echo.Batches, echo.MeanBatchSize, echo.BatchMaxSize)
	}
	r := echo.Replicas[0]
	if r.ID != "echo-1" || r.State != "busy" || r.Pid != 4242 || !slices.Equal(r.GPUs, []int{0}) || r.UptimeSeconds != 90 || r.IdleExpiry != nil {
		t.Errorf("replica = %+v", r)
	}
	zeta := got.Results[1]
	if zeta.LatencyP50 != nil || len(zeta.Replicas) != 0 {
		t.Errorf("zeta (no calls, not loaded) = %+v", zeta)
	}
}

func TestStatusCallsCarryTimingsNotData(t *testing.T) {
	env, _ := newStatusEnv(t)
	rec := serve(env.h, "GET", "/v1/status/calls?limit=2", "", "X-Service-API-Key", keyAcme)
	got := decode[status.Results[status.Call]](t, rec)
	if len(got.Results) != 2 {
		t.Fatalf("limit=2 gave %d calls", len(got.Results))
	}
	if c := got.Results[0]; c.ID != "c4" || c.State != "queued" || c.Finished != nil || c.TotalMs != nil {
		t.Errorf("queued call = %+v", c)
	}
	if c := got.Results[1]; c.QueueMs != 1 || c.RunMs != 9 || c.TotalMs == nil || *c.TotalMs != 10 || c.Message != "" {
		t.Errorf("finished call = %+v", c)
	}
	if strings.Contains(rec.Body.String(), "secret") {
		t.Errorf("inputs or outputs leaked: %s", rec.Body)
	}
	failed := decode[status.Results[status.Call]](t, serve(env.h, "GET", "/v1/status/calls", "", "X-Service-API-Key", keyAcme)).Results[5]
	if failed.State != "failed" || failed.Message != "error: model returned HTTP 500" {
		t.Errorf("failed call = %+v", failed)
	}
	apiErrorReply(t, serve(env.h, "GET", "/v1/status/calls?limit=x", "", "X-Service-API-Key", keyAcme), http.StatusBadRequest, codeBadRequest)
}

func TestStatusReplicaLogs(t *testing.T) {
	env, _ := newStatusEnv(t)
	tests := []struct {
		name, key, path string
		status          int
		want            []string
	}{
		{"own replica", keyAcme, "/v1/status/projects/echo/replicas/echo-1/logs", 200, []string{"booting echo-1", "listening"}},
		{"last line", keyAcme, "/v1/status/projects/echo/replicas/echo-1/logs?lines=1", 200, []string{"listening"}},
		{"admin", keyAdmin, "/v1/status/projects/hidden/replicas/hidden-1/logs", 200, []string{"booting hidden-1", "listening"}},
		{"other team's project", keyAcme, "/v1/status/projects/hidden/replicas/hidden-1/logs", 404, nil},
		{"unknown project", keyAcme, "/v1/status/projects/nope/replicas/nope-1/logs", 404, nil},
		{"replica of another project", keyAcme, "/v1/status/projects/echo/replicas/hidden-1/logs", 404, nil},
		{"no log yet", keyAcme, "/v1/status/projects/echo/replicas/echo-2/logs", 404, nil},
		{"log of the project's former team", keyAcme, "/v1/status/projects/echo/replicas/echo-7/logs", 404, nil},
		{"path traversal", keyAcme, "/v1/status/projects/echo/replicas/echo-..%2F..%2Fhidden%2Fhidden-1/logs", 404, nil},
		{"bad lines", keyAcme, "/v1/status/projects/echo/replicas/echo-1/logs?lines=-3", 400, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			rec := serve(env.h, "GET", tc.path, "", "X-Service-API-Key", tc.key)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.status != 200 {
				if strings.Contains(rec.Body.String(), "listening") {
					t.Errorf("error reply shows the log: %s", rec.Body)
				}
				return
			}
			if got := decode[status.Log](t, rec).Lines; !slices.Equal(got, tc.want) {
				t.Errorf("lines %q, want %q", got, tc.want)
			}
		})
	}
}

func TestStatusPageIsServedWithAStrictPolicy(t *testing.T) {
	env, _ := newStatusEnv(t)
	tests := []struct{ path, contentType, contains string }{
		{"/", "text/html", `<script src="/assets/app.js"`},
		{"/assets/app.js", "javascript", "/v1/status"},
		{"/assets/style.css", "text/css", ".gpu"},
	}
	for _, tc := range tests {
		rec := serve(env.h, "GET", tc.path, "")
		if rec.Code != 200 || !strings.Contains(rec.Header().Get("Content-Type"), tc.contentType) ||
			!strings.Contains(rec.Body.String(), tc.contains) {
			t.Errorf("GET %s: %d %q, body lacks %q", tc.path, rec.Code, rec.Header().Get("Content-Type"), tc.contains)
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") {
			t.Errorf("GET %s: CSP %q", tc.path, csp)
		}
	}
	for _, path := range []string{"/assets/nope.js", "/assets/index.html", "/assets/..%2Fweb.go"} {
		if rec := serve(env.h, "GET", path, ""); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s: %d, want 404", path, rec.Code)
		}
	}
}

func TestStatusOffWithoutSources(t *testing.T) {
	env := newEnv(t, Options{})
	for _, path := range []string{"/", "/v1/status"} {
		if rec := serve(env.h, "GET", path, "", "X-Service-API-Key", keyAdmin); rec.Code != http.StatusNotFound {
			t.Errorf("GET %s without Status: %d, want 404", path, rec.Code)
		}
	}
}

// TestStatusSharedGPU: a GPU shared by replicas of two teams is shown to each
// team as held by its own replica, and a share-only project (gpuMemoryMiB
// without gpus) reports the one GPU each replica gets.
func TestStatusSharedGPU(t *testing.T) {
	devs := gpu.Simulated([]gpu.SimulatedGPU{{Name: "Sim A"}}).Devices()
	shared := []string{devs[0].UUID}
	// Projects in id order, as the scheduler gives them: acme's echo sorts
	// before other's hidden.
	snap := scheduler.Status{Projects: []scheduler.ProjectStatus{
		{ID: "echo", TeamID: "acme", Running: 1, Replicas: []scheduler.ReplicaStatus{
			{ID: "echo-1", State: "ready", GPUs: shared, Started: statusNow}}},
		{ID: "hidden", TeamID: "other", Running: 1, Replicas: []scheduler.ReplicaStatus{
			{ID: "hidden-1", State: "ready", GPUs: shared, Started: statusNow}}},
	}, GPUs: []scheduler.GPUStatus{{UUID: devs[0].UUID, ReservedMiB: 2048, Replicas: []string{"echo-1", "hidden-1"}}}}
	env := newEnv(t, Options{Status: &status.Sources{
		Snapshot: func() scheduler.Status { return snap },
		GPUs:     func() []gpu.Device { return devs },
		Now:      func() time.Time { return statusNow },
	}})
	echo := env.store.project("echo")
	echo.Model.GPUMemoryMiB = 1024
	env.store.addProject(t, echo, "mk-echo")

	for _, tc := range []struct{ key, want string }{{keyAcme, "echo-1"}, {keyOther, "hidden-1"}} {
		st := decode[status.All](t, serve(env.h, "GET", "/v1/status", "", "X-Service-API-Key", tc.key))
		if g := st.GPUs[0]; !g.Held || g.HeldBy == nil || g.HeldBy.Replica != tc.want {
			t.Errorf("key %s: GPU held by %+v, want its own %s", tc.key, g.HeldBy, tc.want)
		}
		if tc.key == keyAcme {
			if p := st.Projects[0]; p.ID != "echo" || p.GPUs != 1 || !slices.Equal(p.Replicas[0].GPUs, []int{0}) {
				t.Errorf("share-only project = %+v, want gpusPerReplica 1 and its replica on GPU 0", p)
			}
		}
	}
}

func TestStatusGPUsReportHealthAndMIGDevices(t *testing.T) {
	devs := []gpu.Device{
		{Index: 0, UUID: "GPU-lost", Name: "A100", MemoryTotalMiB: 40960, Problem: "lost (ERROR_GPU_IS_LOST)"},
		{Index: 1, UUID: "MIG-x", Name: "H100 MIG 1g.10gb", MemoryTotalMiB: 9856, MemoryFreeMiB: 9856, MIG: true, Parent: "GPU-h"},
	}
	env := newEnv(t, Options{Status: &status.Sources{
		Snapshot: func() scheduler.Status { return scheduler.Status{} },
		GPUs:     func() []gpu.Device { return devs },
		Now:      func() time.Time { return statusNow },
	}})
	rec := serve(env.h, "GET", "/v1/status/gpus", "", "X-Service-API-Key", keyAcme)
	got := decode[struct {
		Results []map[string]any `json:"results"`
	}](t, rec).Results
	if len(got) != 2 {
		t.Fatalf("GPUs = %v", got)
	}
	for k, want := range []map[string]any{
		{"uuid": "GPU-lost", "healthy": false, "problem": "lost (ERROR_GPU_IS_LOST)", "mig": false},
		{"uuid": "MIG-x", "healthy": true, "mig": true, "parent": "GPU-h"},
	} {
		for key, v := range want {
			if got[k][key] != v {
				t.Errorf("GPU %d: %s = %v, want %v", k, key, got[k][key], v)
			}
		}
	}
	if _, ok := got[1]["problem"]; ok {
		t.Errorf("a healthy device has a problem field: %v", got[1])
	}
}
