package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/cluster"
	"inferd/httpapi/metrics"
	"inferd/httpapi/status"
	"inferd/store"
)

// fakeCluster is a status.ClusterView as *cluster.Node would give it.
type fakeCluster struct {
	name, leader string
	nodes        []cluster.NodeInfo
	placement    map[string]cluster.Placement
}

func (f *fakeCluster) Name() string              { return f.name }
func (f *fakeCluster) Nodes() []cluster.NodeInfo { return f.nodes }
func (f *fakeCluster) Leader() string            { return f.leader }
func (f *fakeCluster) Placement(project string) (cluster.Placement, bool) {
	p, ok := f.placement[project]
	return p, ok
}

// twoNodeCluster is box-1 (this node, with a GPU held and one free) and
// box-2 (the leader, CPU only), with echo placed on both, and hidden
// (another team's) on box-2.
func twoNodeCluster() *fakeCluster {
	at := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	return &fakeCluster{
		name: "box-1", leader: "box-2",
		nodes: []cluster.NodeInfo{
			{Name: "box-1", Advertise: "http://10.0.0.1:8080", Member: true, Started: at, Updated: at,
				Capacity: cluster.Capacity{CPUSlots: 4, CPUUsed: 1, GPUs: []cluster.GPUInfo{
					{Index: 0, TotalMiB: 24000, FreeMiB: 0, Healthy: true, InUse: true},
					{Index: 1, TotalMiB: 24000, FreeMiB: 24000, Healthy: true},
				}},
				Projects: map[string]cluster.ProjectLoad{"echo": {Replicas: 2, Ready: 2, Busy: 1, Queued: 3}}},
			{Name: "box-2", Advertise: "http://10.0.0.2:8080", Started: at, Updated: at,
				Capacity: cluster.Capacity{CPUSlots: 8},
				Projects: map[string]cluster.ProjectLoad{
					"echo":   {Replicas: 1, Ready: 1},
					"hidden": {Replicas: 1, Ready: 1, Busy: 1},
				}},
		},
		placement: map[string]cluster.Placement{
			"echo":   {Project: "echo", Leader: "box-2", Updated: at, Nodes: map[string]cluster.Share{"box-2": {Min: 0, Max: 1}, "box-1": {Min: 1, Max: 2}}},
			"hidden": {Project: "hidden", Leader: "box-2", Updated: at, Nodes: map[string]cluster.Share{"box-2": {Min: 1, Max: 1}}},
		},
	}
}

var errEtcdGone = fmt.Errorf("get call: etcd: context deadline exceeded: %w", store.ErrUnavailable)

// unavailableInference checks an inference answer to etcd not answering:
// HTTP 503 with the usual JSON answer saying so.
func unavailableInference(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Code != http.StatusServiceUnavailable {
		t.Fatalf("status %d, want 503; body %s", rec.Code, rec.Body)
	}
	var body struct {
		ID, Message, APIVersion string
		Created                 int64
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("body is not the inference JSON: %v: %s", err, rec.Body)
	}
	if body.Message != "error: cluster unavailable; retry" || body.ID == "" || body.Created == 0 {
		t.Errorf("answer %s, want message %q with id and created", rec.Body, "error: cluster unavailable; retry")
	}
}

// Whenever etcd does not answer (store.ErrUnavailable, from the key's
// read, the scheduler's write or a call's read), every route family
// answers 503 "cluster unavailable; retry" in its own JSON shape: the
// inference answer, the project API's error body, /run's.
func TestClusterUnavailableIs503OnEveryRouteFamily(t *testing.T) {
	start := `{"apiKey":"` + keyAcme + `","modelKey":"mk-echo","modelInputs":{}}`
	check := `{"apiKey":"` + keyAcme + `","callID":"call_x","longPoll":true}`
	cancel := `{"apiKey":"` + keyAcme + `","callID":"call_x"}`
	const (
		inference = iota
		projectAPI
	)
	cases := []struct {
		name         string
		breaks       func(e *testEnv) // what stops answering
		method, path string
		body         string
		header       []string
		shape        int
	}{
		{"start, key read", authDown, "POST", "/start/v4", start, nil, inference},
		{"start, call write", schedDown, "POST", "/start/v4/", start, nil, inference},
		{"check, key read", authDown, "POST", "/check/v4", check, nil, inference},
		{"check, call read", lookupDown, "POST", "/check/v3", check, nil, inference},
		{"cancel, call read", lookupDown, "POST", "/cancel/v4", cancel, nil, inference},
		{"project list", authDown, "GET", "/v1/projects", "", []string{"X-Service-API-Key", keyAcme}, projectAPI},
		{"project update", authDown, "PUT", "/v1/projects/echo", `{"maxReplicas":2}`, []string{"X-Service-API-Key", keyAcme}, projectAPI},
		{"status", authDown, "GET", "/v1/status", "", []string{"X-Service-API-Key", keyAcme}, projectAPI},
		{"cluster status", authDown, "GET", "/v1/status/cluster", "", []string{"X-Service-API-Key", keyAcme}, projectAPI},
		{"events, call read", lookupDown, "GET", "/v1/calls/call_x/events", "", []string{"X-Service-API-Key", keyAcme}, projectAPI},
		{"run, key read", authDown, "POST", "/run/echo/predict", `{}`, []string{"X-Banana-API-Key", keyAcme}, projectAPI},
		{"run, call write", schedDown, "POST", "/run/echo/predict", `{}`, []string{"X-Banana-API-Key", keyAcme}, projectAPI},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Options{Status: &status.Sources{}, Cluster: twoNodeCluster()})
			e.sched.add(store.Call{ID: "call_x", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
			tc.breaks(e)
			rec := serve(e.h, tc.method, tc.path, tc.body, tc.header...)
			if tc.shape == inference {
				unavailableInference(t, rec)
				return
			}
			if msg := apiErrorReply(t, rec, http.StatusServiceUnavailable, "unavailable"); msg != "cluster unavailable; retry" {
				t.Errorf("message %q, want %q", msg, "cluster unavailable; retry")
			}
		})
	}
}

func authDown(e *testEnv)   { e.store.authErr = fmt.Errorf("authenticate: %w", store.ErrUnavailable) }
func schedDown(e *testEnv)  { e.sched.submitErr = fmt.Errorf("save call: %w", store.ErrUnavailable) }
func lookupDown(e *testEnv) { e.sched.lookupErr = errEtcdGone }

// In cluster mode, a long poll whose wait has ended answers with the state
// it last saw when the call's read then hangs (etcd gone): it is not held
// for the store's request timeout.
func TestLongPollEndsNearItsWaitWhenEtcdHangs(t *testing.T) {
	e := newEnv(t, Options{LongPollWait: 20 * time.Millisecond, Cluster: twoNodeCluster()})
	e.sched.add(store.Call{ID: "call_x", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
	hang := make(chan struct{})
	defer close(hang) // lets the held read end with the test
	e.sched.mu.Lock()
	e.sched.lookupBlock, e.sched.lookupFree = hang, 1 // the check's first read answers, the one after the wait hangs
	e.sched.mu.Unlock()
	began := time.Now()
	rec := waitResult(t, serveAsync(e.h, "POST", "/check/v4", `{"apiKey":"`+keyAcme+`","callID":"call_x","longPoll":true}`))
	if m := inferenceReply(t, rec); m["message"] != "running" {
		t.Errorf("message %v, want the state last seen, running", m["message"])
	}
	if took := time.Since(began); took > 20*time.Millisecond+rereadWithin+2*time.Second {
		t.Errorf("the long poll took %v, want about its wait plus %v", took, rereadWithin)
	}
}

// In cluster mode /v1/status has a cluster section: this node, the
// leader, every live node with its GPUs, CPU slots and load, and each
// project's placement; a team key sees only its team's projects there. A
// single box has no such section.
func TestStatusShowsTheClusterToWhatTheKeyMaySee(t *testing.T) {
	type section struct {
		Cluster *status.Cluster `json:"cluster"`
	}
	e := newEnv(t, Options{Status: &status.Sources{}, Cluster: twoNodeCluster()})
	got := decode[section](t, serve(e.h, "GET", "/v1/status", "", "X-Service-API-Key", keyAcme)).Cluster
	if got == nil {
		t.Fatal("no cluster section in cluster mode")
	}
	if got.Node != "box-1" || got.Leader != "box-2" || len(got.Nodes) != 2 {
		t.Fatalf("cluster = node %q leader %q, %d nodes; want box-1, box-2, 2", got.Node, got.Leader, len(got.Nodes))
	}
	b1, b2 := got.Nodes[0], got.Nodes[1]
	if !b1.Self || b1.Leader || !b2.Leader || b2.Self || b1.Advertise != "http://10.0.0.1:8080" {
		t.Errorf("nodes = %+v, %+v; want box-1 self, box-2 leader", b1, b2)
	}
	if want := (status.NodeGPUs{Total: 2, Free: 1, MemoryTotalMiB: 48000, MemoryFreeMiB: 24000}); b1.GPUs != want || b1.CPUSlots != 4 || b1.CPUUsed != 1 {
		t.Errorf("box-1 capacity = %+v, cpu %d/%d; want %+v, cpu 1/4", b1.GPUs, b1.CPUUsed, b1.CPUSlots, want)
	}
	if want := []status.NodeProject{{ID: "echo", Replicas: 2, Ready: 2, Busy: 1, Queued: 3}}; !slices.Equal(b1.Projects, want) {
		t.Errorf("box-1 projects = %+v, want %+v", b1.Projects, want)
	}
	if want := []status.NodeProject{{ID: "echo", Replicas: 1, Ready: 1}}; !slices.Equal(b2.Projects, want) {
		t.Errorf("box-2 projects = %+v, want %+v (another team's hidden)", b2.Projects, want)
	}
	var placed []string
	for _, p := range got.Placement {
		for _, n := range p.Nodes {
			placed = append(placed, fmt.Sprintf("%s@%s:%d-%d", p.Project, n.Node, n.Min, n.Max))
		}
		if p.Project == "zeta" && (len(p.Nodes) != 0 || p.Updated != nil) {
			t.Errorf("zeta placement %+v, want none yet", p)
		}
	}
	if want := []string{"echo@box-1:1-2", "echo@box-2:0-1"}; !slices.Equal(placed, want) {
		t.Errorf("placement = %v, want %v (zeta not placed yet, another team's hidden not shown)", placed, want)
	}

	admin := decode[section](t, serve(e.h, "GET", "/v1/status", "", "X-Service-API-Key", keyAdmin)).Cluster
	if admin == nil || len(admin.Nodes[1].Projects) != 2 || len(admin.Placement) != 3 {
		t.Errorf("admin's cluster section = %+v; want every project", admin)
	}
	// The section alone, as /v1/status has it for the same key.
	alone := decode[status.Cluster](t, serve(e.h, "GET", "/v1/status/cluster/", "", "X-Service-API-Key", keyAcme))
	if alone.Leader != "box-2" || len(alone.Nodes) != 2 || len(alone.Placement) != 2 || len(alone.Nodes[1].Projects) != 1 {
		t.Errorf("/v1/status/cluster = %+v; want the team's view of two nodes", alone)
	}

	single := newEnv(t, Options{Status: &status.Sources{}})
	if body := serve(single.h, "GET", "/v1/status", "", "X-Service-API-Key", keyAcme).Body.String(); strings.Contains(body, `"cluster"`) {
		t.Errorf("a single box's status has a cluster section: %s", body)
	}
	apiErrorReply(t, serve(single.h, "GET", "/v1/status/cluster", "", "X-Service-API-Key", keyAcme), http.StatusNotFound, codeNotFound)
}

// In cluster mode every sample names the node that wrote it, and the
// cluster gauges say how many nodes are live and whether this one leads.
func TestMetricsNameTheNodeInClusterMode(t *testing.T) {
	c := twoNodeCluster()
	m := loadedMetricsIn(c)
	e := newEnv(t, Options{Metrics: m})
	serve(e.h, "GET", "/healthz", "")
	text := serve(e.h, "GET", "/metrics", "").Body.String()
	samples := parseExposition(t, text)
	for name := range samples {
		if !strings.Contains(name, `{node="box-1"`) {
			t.Errorf("sample %s has no node label first", name)
		}
	}
	for _, want := range []string{
		`inferd_cluster_nodes{node="box-1"}`,
		`inferd_queue_depth{node="box-1",project="echo"}`,
		`inferd_longpolls_in_flight{node="box-1"}`,
		`inferd_http_requests_total{node="box-1",route="/healthz",status="200"}`,
	} {
		if _, ok := samples[want]; !ok {
			t.Errorf("no sample %s", want)
		}
	}
	if samples[`inferd_cluster_nodes{node="box-1"}`] != 2 || samples[`inferd_cluster_leader{node="box-1"}`] != 0 {
		t.Errorf("cluster gauges: nodes %v leader %v, want 2 and 0 (box-2 leads)",
			samples[`inferd_cluster_nodes{node="box-1"}`], samples[`inferd_cluster_leader{node="box-1"}`])
	}
	c.leader = "box-1"
	if s := parseExposition(t, serve(e.h, "GET", "/metrics", "").Body.String()); s[`inferd_cluster_leader{node="box-1"}`] != 1 {
		t.Errorf("inferd_cluster_leader on the leader = %v, want 1", s[`inferd_cluster_leader{node="box-1"}`])
	}

	single := parseExposition(t, serve(newEnv(t, Options{Metrics: loadedMetrics()}).h, "GET", "/metrics", "").Body.String())
	for name := range single {
		if strings.Contains(name, "node=") || strings.HasPrefix(name, "inferd_cluster_") {
			t.Errorf("a single box writes %s", name)
		}
	}
}

// loadedMetricsIn is loadedMetrics on a node of cluster c.
func loadedMetricsIn(c status.ClusterView) *metrics.Metrics { return loadedMetricsWith(c) }
