// Package metrics keeps inferd's Prometheus metrics: counters and
// histograms updated as things happen (it is the scheduler's Observer, and
// the API counts its requests, refusals and long polls here), and gauges
// read from its Sources at each scrape, written with # HELP and # TYPE from
// one table (meta.go) that docs/metrics.md mirrors.
package metrics

import (
	"bytes"
	"fmt"
	"io"
	"maps"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	// VictoriaMetrics/metrics rather than prometheus/client_golang: it adds
	// about 0.5 MB to the binary against about 2.9 MB, and writes the same
	// Prometheus text format (see shared/LIBRARIES.md).
	vm "github.com/VictoriaMetrics/metrics"
	"github.com/julienschmidt/httprouter"

	"inferd/cluster"
	"inferd/gpu"
	"inferd/pipeline"
	"inferd/scheduler"
	"inferd/store"
	"inferd/webhook"
)

// durationBuckets are the upper bounds, in seconds, of the latency, queue,
// boot and run time histograms: 5 ms to 1 h (a call can wait out several
// boot timeouts of 10 min).
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}

// Sources are read at scrape time for the gauges. Any may be nil.
type Sources struct {
	Status func() scheduler.Status // the scheduler's Snapshot
	GPUs   func() []gpu.Device     // the GPU inventory's Devices
	Store  StoreStats
	Conns  func() ConnStats // the API's connection limit (httpapi.ConnLimit)
	// Webhooks is the webhook deliverer's TeamStats: its counts by team.
	Webhooks func() map[string]webhook.Stats
	// EtcdOps, in cluster mode, counts what this node's store asked of
	// etcd (inferd_etcd_*_total); nil on a single box.
	EtcdOps func() store.OpStats
	// Cluster, in cluster mode, names this node on every sample (a node
	// label) and gives the inferd_cluster_* gauges; nil on a single box.
	Cluster Cluster
}

// Cluster is what the metrics read of this node's cluster view
// (*cluster.Node).
type Cluster interface {
	// Name is this node's name.
	Name() string
	// Nodes are the live nodes.
	Nodes() []cluster.NodeInfo
	// Leader is the leader's node name, "" while there is none.
	Leader() string
}

// ConnStats is the state of the API's connection limit (httpapi's
// ConnLimit.Stats).
type ConnStats struct {
	Open, Max int
	// Sending are the open connections still sending a request (headers
	// or body): the first closed for room. Reserved are those open on the
	// probes' reserve, beyond Max.
	Sending, Reserved int
	Waiting           int64 // accepted, waiting for room: 0 or 1
	Shed              int64 // closed to make room, since start
}

// StoreStats is what the metrics read of the store; *bolt.Store has it.
type StoreStats interface {
	CommitStats() store.CommitStats
	Size() int64
}

// Metrics keeps inferd's Prometheus metrics in one metrics.Set that the
// caller owns: counters and histograms updated as things happen (it is the
// scheduler's Observer and counts HTTP requests), and gauges read from
// Sources at each scrape. Its methods are safe for concurrent use.
type Metrics struct {
	set       *vm.Set
	src       atomic.Pointer[Sources]
	longPolls atomic.Int64
	edge      atomic.Pointer[func() EdgeStats] // the API's budgets, set by SetEdge
	// calls, usage and requests hold the series of CallFinished and
	// countRequest by their labels (callSeriesKey, usageSeriesKey,
	// requestSeriesKey), named once.
	calls, usage, requests sync.Map
}

// EdgeStats is what the budgets of the API's edge hold now.
type EdgeStats struct {
	BodyBytes         int64 // request body bytes being read
	Streams           int64 // event streams open
	StreamResultBytes int64 // results held for event streams
}

// SetEdge sets where the edge's gauges come from, and creates the refusal
// counter's series for budgets, so that each shows 0 before its first
// refusal. A nil m counts nothing.
func (m *Metrics) SetEdge(stats func() EdgeStats, budgets []string) {
	if m == nil {
		return
	}
	m.edge.Store(&stats)
	for _, b := range budgets {
		m.refusals(b)
	}
}

// BudgetRefused counts a request refused, or a stream cut, by budget. A
// nil m counts nothing.
func (m *Metrics) BudgetRefused(budget string) {
	if m != nil {
		m.refusals(budget).Inc()
	}
}

// AdmissionRefused counts a request refused by the call path's admission
// hook named hook. A nil m counts nothing.
func (m *Metrics) AdmissionRefused(hook string) {
	if m != nil {
		m.admissionRefusals(hook).Inc()
	}
}

// SetHooks creates the admission refusal counter's series, so that each
// of p's hooks shows 0 before its first refusal. A nil m counts nothing.
func (m *Metrics) SetHooks(p *pipeline.Pipeline) {
	if m != nil {
		p.Refusals(func(hook string, _ uint64) { m.admissionRefusals(hook) })
	}
}

func (m *Metrics) admissionRefusals(hook string) *vm.Counter {
	return m.set.GetOrCreateCounter(`inferd_admission_refusals_total{hook="` + labelValue(hook) + `"}`)
}

func (m *Metrics) refusals(budget string) *vm.Counter {
	return m.set.GetOrCreateCounter(`inferd_budget_refusals_total{budget="` + labelValue(budget) + `"}`)
}

var _ scheduler.Observer = (*Metrics)(nil)

// New returns Metrics that register in set. Call SetSources before
// serving scrapes; until then only the event counters are written.
func New(set *vm.Set) *Metrics {
	return &Metrics{set: set}
}

// SetSources sets where the scrape-time gauges come from.
func (m *Metrics) SetSources(src Sources) { m.src.Store(&src) }

// CallFinished counts a finished call and records its latency (created to
// finished), its queue, boot and run times, and the tokens its model
// reported; a call that never reached a replica records only its latency.
func (m *Metrics) CallFinished(c store.Call) {
	s := m.callSeries(c.ProjectID, c.State == store.CallSucceeded)
	s.calls.Inc()
	if t := c.Tokens; t != nil {
		tl := `{team="` + labelValue(c.TeamID) + `",project="` + labelValue(c.ProjectID) + `",kind="`
		m.set.GetOrCreateCounter(`inferd_tokens_total` + tl + `prompt"}`).Add(int(t.Prompt))
		m.set.GetOrCreateCounter(`inferd_tokens_total` + tl + `completion"}`).Add(int(t.Completion))
	}
	if !c.Finished.IsZero() && !c.Created.IsZero() {
		s.seconds.Update(max(c.Finished.Sub(c.Created).Seconds(), 0))
	}
	m.callUsage(c)
	if c.Dispatched.IsZero() {
		return
	}
	s.queue.Update(float64(c.QueueMs) / 1000)
	s.boot.Update(float64(c.BootMs) / 1000)
	s.run.Update(float64(c.RunMs) / 1000)
}

// callSeries are the series CallFinished updates for one project and
// outcome, named once: every call finishing used to build five names and
// look each up in the set.
type callSeries struct {
	calls            *vm.Counter
	seconds          *vm.PrometheusHistogram
	queue, boot, run *vm.PrometheusHistogram
}

type callSeriesKey struct {
	project   string
	succeeded bool
}

func (m *Metrics) callSeries(project string, succeeded bool) *callSeries {
	k := callSeriesKey{project, succeeded}
	if s, ok := m.calls.Load(k); ok {
		return s.(*callSeries)
	}
	outcome := "failed"
	if succeeded {
		outcome = "succeeded"
	}
	p := labelValue(project)
	labels := `{project="` + p + `",outcome="` + outcome + `"}`
	s := &callSeries{
		calls:   m.set.GetOrCreateCounter(`inferd_calls_total` + labels),
		seconds: m.set.GetOrCreatePrometheusHistogramExt(`inferd_call_seconds`+labels, durationBuckets),
		queue:   m.histogram("inferd_call_queue_seconds", p),
		boot:    m.histogram("inferd_call_boot_seconds", p),
		run:     m.histogram("inferd_call_run_seconds", p),
	}
	actual, _ := m.calls.LoadOrStore(k, s) // GetOrCreate hands both the same series
	return actual.(*callSeries)
}

func (m *Metrics) histogram(name, project string) *vm.PrometheusHistogram {
	return m.set.GetOrCreatePrometheusHistogramExt(name+`{project="`+project+`"}`, durationBuckets)
}

// batchSizeBuckets are the upper bounds of the batch size histogram:
// powers of two up to store.MaxBatchSize.
var batchSizeBuckets = []float64{1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024}

// batchWaitBuckets are the upper bounds, in seconds, of the batch wait
// histogram: 1 ms to store.MaxBatchWaitMs.
var batchWaitBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10}

// BatchDispatched records a batch's size and how long it waited to fill.
func (m *Metrics) BatchDispatched(project string, size int, wait time.Duration) {
	p := `{project="` + labelValue(project) + `"}`
	m.set.GetOrCreatePrometheusHistogramExt(`inferd_batch_size`+p, batchSizeBuckets).Update(float64(size))
	m.set.GetOrCreatePrometheusHistogramExt(`inferd_batch_wait_seconds`+p, batchWaitBuckets).Update(wait.Seconds())
}

// ReplicaStarted counts a replica boot.
func (m *Metrics) ReplicaStarted(project string) {
	m.projectCounter("inferd_replica_starts_total", project)
}

// ReplicaCrashed counts a replica that exited unasked.
func (m *Metrics) ReplicaCrashed(project string) {
	m.projectCounter("inferd_replica_crashes_total", project)
}

// ReplicaEvicted counts an idle replica stopped for another project.
func (m *Metrics) ReplicaEvicted(project string) {
	m.projectCounter("inferd_replica_evictions_total", project)
}

// CallCancelled counts a call ended by a cancel or a queue purge.
func (m *Metrics) CallCancelled(project string) {
	m.projectCounter("inferd_calls_cancelled_total", project)
}

// CallExpired counts a call whose queueTimeout passed in the queue.
func (m *Metrics) CallExpired(project string) {
	m.projectCounter("inferd_calls_expired_total", project)
}

// CallRetried counts a call run again after a restart or a model crash.
func (m *Metrics) CallRetried(project string) {
	m.projectCounter("inferd_calls_retried_total", project)
}

// ReplicaOOMKilled counts a replica killed for going over its memoryMiB.
func (m *Metrics) ReplicaOOMKilled(project string) {
	m.projectCounter("inferd_replica_oom_kills_total", project)
}

// callUsage adds a finished call's usage to the inferd_usage_* counters:
// the same totals as the usage ledger's (GET /v1/usage), since the daemon
// started.
func (m *Metrics) callUsage(c store.Call) {
	u := c.Usage
	if u == nil {
		return
	}
	s := m.usageSeries(c.TeamID, c.ProjectID)
	s.calls.Inc()
	s.replica.Add(u.ReplicaSeconds)
	s.gpu.Add(u.GPUSeconds)
	s.bytesIn.Add(int(u.BytesIn))
	s.bytesOut.Add(int(u.BytesOut))
	if u.CPUSeconds != nil {
		s.counter(&s.cpu, "inferd_usage_cpu_seconds_total").Add(*u.CPUSeconds)
	}
	if u.EnergyJoules != nil {
		s.counter(&s.energy, "inferd_usage_energy_joules_total").Add(*u.EnergyJoules)
	}
}

// usageSeries are the inferd_usage_* counters every call of one team and
// project adds to, named once as callSeries are. The CPU and energy series
// are named at their first measure, so a box that cannot take one shows no
// series for it rather than a zero.
type usageSeries struct {
	set                      *vm.Set
	labels                   string
	calls, bytesIn, bytesOut *vm.Counter
	replica, gpu             *vm.FloatCounter
	cpu, energy              atomic.Pointer[vm.FloatCounter]
}

type usageSeriesKey struct{ team, project string }

func (m *Metrics) usageSeries(team, project string) *usageSeries {
	k := usageSeriesKey{team, project}
	if s, ok := m.usage.Load(k); ok {
		return s.(*usageSeries)
	}
	tp := usageLabels(team, project)
	s := &usageSeries{
		set:      m.set,
		labels:   tp,
		calls:    m.set.GetOrCreateCounter(`inferd_usage_calls_total{` + tp + `}`),
		replica:  m.set.GetOrCreateFloatCounter(`inferd_usage_replica_seconds_total{` + tp + `,phase="call"}`),
		gpu:      m.set.GetOrCreateFloatCounter(`inferd_usage_gpu_seconds_total{` + tp + `,phase="call"}`),
		bytesIn:  m.set.GetOrCreateCounter(`inferd_usage_bytes_total{` + tp + `,direction="in"}`),
		bytesOut: m.set.GetOrCreateCounter(`inferd_usage_bytes_total{` + tp + `,direction="out"}`),
	}
	actual, _ := m.usage.LoadOrStore(k, s)
	return actual.(*usageSeries)
}

// counter returns *p, naming the series on first use.
func (s *usageSeries) counter(p *atomic.Pointer[vm.FloatCounter], name string) *vm.FloatCounter {
	if c := p.Load(); c != nil {
		return c
	}
	c := s.set.GetOrCreateFloatCounter(name + `{` + s.labels + `}`) // the same series to every racer
	p.Store(c)
	return c
}

// ReplicaUsage adds the replica time no call used to the
// inferd_usage_*_seconds_total counters, as boot or idle.
func (m *Metrics) ReplicaUsage(rows []store.UsageRow) {
	for _, r := range rows {
		tp := usageLabels(r.TeamID, r.ProjectID)
		for _, x := range []struct {
			name, phase string
			v           float64
		}{
			{"inferd_usage_replica_seconds_total", "boot", r.BootReplicaSeconds},
			{"inferd_usage_replica_seconds_total", "idle", r.IdleReplicaSeconds},
			{"inferd_usage_gpu_seconds_total", "boot", r.BootGPUSeconds},
			{"inferd_usage_gpu_seconds_total", "idle", r.IdleGPUSeconds},
		} {
			if x.v > 0 {
				m.set.GetOrCreateFloatCounter(x.name + `{` + tp + `,phase="` + x.phase + `"}`).Add(x.v)
			}
		}
	}
}

func usageLabels(team, project string) string {
	return `team="` + labelValue(team) + `",project="` + labelValue(project) + `"`
}

func (m *Metrics) projectCounter(name, project string) {
	m.set.GetOrCreateCounter(name + `{project="` + labelValue(project) + `"}`).Inc()
}

// countRequest counts one answered request by route pattern and status.
func (m *Metrics) countRequest(route string, status int) {
	k := requestSeriesKey{route, status}
	c, ok := m.requests.Load(k)
	if !ok {
		// Routes are the router's patterns and statuses a few: the keys
		// stay few.
		c, _ = m.requests.LoadOrStore(k, m.set.GetOrCreateCounter(`inferd_http_requests_total{route="`+
			labelValue(route)+`",status="`+strconv.Itoa(status)+`"}`))
	}
	c.(*vm.Counter).Inc()
}

type requestSeriesKey struct {
	route  string
	status int
}

// WritePrometheus writes every metric in the Prometheus text format, each
// family headed by its # HELP and # TYPE lines (see metricFamilies).
// In cluster mode every sample carries this node's name as its first
// label, node, so that one Prometheus scraping every node tells them apart.
func (m *Metrics) WritePrometheus(w io.Writer) {
	var buf bytes.Buffer
	m.writeSamples(&buf)
	node := ""
	if src := m.src.Load(); src != nil && src.Cluster != nil {
		node = src.Cluster.Name()
	}
	writeWithMetadata(w, buf.Bytes(), node)
}

// writeSamples writes every sample line, without metadata.
func (m *Metrics) writeSamples(w io.Writer) {
	m.set.WritePrometheus(w)
	vm.WriteGaugeUint64(w, "inferd_longpolls_in_flight", uint64(max(m.longPolls.Load(), 0)))
	if edge := m.edge.Load(); edge != nil {
		es := (*edge)()
		vm.WriteGaugeUint64(w, "inferd_request_body_bytes", uint64(max(es.BodyBytes, 0)))
		vm.WriteGaugeUint64(w, "inferd_event_streams", uint64(max(es.Streams, 0)))
		vm.WriteGaugeUint64(w, "inferd_event_stream_result_bytes", uint64(max(es.StreamResultBytes, 0)))
	}
	src := m.src.Load()
	if src == nil {
		return
	}
	var st scheduler.Status
	if src.Status != nil {
		st = src.Status()
		writeSchedulerGauges(w, st)
	}
	if src.GPUs != nil {
		writeGPUGauges(w, src.GPUs(), st.ReservedMiB())
	}
	if src.Conns != nil {
		cs := src.Conns()
		vm.WriteGaugeUint64(w, "inferd_connections_open", uint64(max(cs.Open, 0)))
		vm.WriteGaugeUint64(w, "inferd_connections_max", uint64(max(cs.Max, 0)))
		vm.WriteCounterUint64(w, "inferd_connections_closed_for_room_total", uint64(max(cs.Shed, 0)))
		vm.WriteGaugeUint64(w, "inferd_connections_sending", uint64(max(cs.Sending, 0)))
		vm.WriteGaugeUint64(w, "inferd_connections_reserved", uint64(max(cs.Reserved, 0)))
	}
	if src.Store != nil {
		cs := src.Store.CommitStats()
		vm.WriteGaugeUint64(w, "inferd_store_file_bytes", uint64(max(src.Store.Size(), 0)))
		vm.WriteCounterUint64(w, "inferd_store_commits_total", uint64(max(cs.Commits, 0)))
		vm.WriteCounterFloat64(w, "inferd_store_commit_seconds_total", cs.Duration.Seconds())
	}
	if src.EtcdOps != nil {
		os := src.EtcdOps()
		vm.WriteCounterUint64(w, "inferd_etcd_requests_total", uint64(max(os.Requests, 0)))
		vm.WriteCounterUint64(w, "inferd_etcd_reads_total", uint64(max(os.Reads, 0)))
		vm.WriteCounterUint64(w, "inferd_etcd_writes_total", uint64(max(os.Writes, 0)))
	}
	if src.Webhooks != nil {
		writeWebhookSamples(w, src.Webhooks())
	}
	if c := src.Cluster; c != nil {
		vm.WriteGaugeUint64(w, "inferd_cluster_nodes", uint64(len(c.Nodes())))
		vm.WriteGaugeUint64(w, "inferd_cluster_leader", boolGauge(c.Leader() == c.Name()))
	}
}

func writeSchedulerGauges(w io.Writer, st scheduler.Status) {
	for _, p := range st.Projects {
		vm.WriteGaugeUint64(w, `inferd_queue_depth{project="`+labelValue(p.ID)+`"}`, uint64(max(p.Queued, 0)))
	}
	for _, p := range st.Projects {
		n := map[string]uint64{}
		for _, r := range p.Replicas {
			n[r.State]++
		}
		// Every state for every project, 0 included, so that series do
		// not come and go.
		for _, state := range scheduler.ReplicaStates {
			vm.WriteGaugeUint64(w, `inferd_replicas{project="`+labelValue(p.ID)+`",state="`+state+`"}`, n[state])
		}
	}
}

// writeWebhookSamples writes the webhook deliverer's counts: the totals,
// and by team the two budgets (senders in flight, pending messages) and the
// drops of the pending cap.
func writeWebhookSamples(w io.Writer, byTeam map[string]webhook.Stats) {
	var all webhook.Stats
	teams := slices.Sorted(maps.Keys(byTeam))
	for _, team := range teams {
		all.Add(byTeam[team])
	}
	vm.WriteCounterUint64(w, `inferd_webhook_deliveries_total{result="delivered"}`, uint64(max(all.Delivered, 0)))
	vm.WriteCounterUint64(w, `inferd_webhook_deliveries_total{result="gave_up"}`, uint64(max(all.GaveUp, 0)))
	vm.WriteCounterUint64(w, `inferd_webhook_deliveries_total{result="dropped"}`, uint64(max(all.Dropped, 0)))
	vm.WriteCounterUint64(w, "inferd_webhook_retries_total", uint64(max(all.Retries, 0)))
	vm.WriteGaugeUint64(w, "inferd_webhook_pending", uint64(max(all.Pending, 0)))
	for _, team := range teams {
		vm.WriteGaugeUint64(w, `inferd_webhook_team_pending{team="`+labelValue(team)+`"}`, uint64(max(byTeam[team].Pending, 0)))
	}
	for _, team := range teams {
		vm.WriteGaugeUint64(w, `inferd_webhook_team_sending{team="`+labelValue(team)+`"}`, uint64(max(byTeam[team].Sending, 0)))
	}
	for _, team := range teams {
		vm.WriteCounterUint64(w, `inferd_webhook_team_dropped_total{team="`+labelValue(team)+`"}`, uint64(max(byTeam[team].Dropped, 0)))
	}
}

// writeGPUGauges writes each GPU's memory and utilization; see memoryOf
// for what used and reserved mean on real and simulated GPUs.
func writeGPUGauges(w io.Writer, devs []gpu.Device, reservedMiB map[string]uint64) {
	lbl := func(d gpu.Device) string {
		return fmt.Sprintf(`{gpu="%d",uuid="%s"}`, d.Index, labelValue(d.UUID))
	}
	for _, d := range devs {
		vm.WriteGaugeUint64(w, "inferd_gpu_memory_total_bytes"+lbl(d), gpu.MemoryOf(d, reservedMiB).Total)
	}
	for _, d := range devs {
		vm.WriteGaugeUint64(w, "inferd_gpu_memory_used_bytes"+lbl(d), gpu.MemoryOf(d, reservedMiB).Used)
	}
	for _, d := range devs {
		vm.WriteGaugeUint64(w, "inferd_gpu_memory_reserved_bytes"+lbl(d), gpu.MemoryOf(d, reservedMiB).Reserved)
	}
	for _, d := range devs {
		vm.WriteGaugeFloat64(w, "inferd_gpu_utilization_ratio"+lbl(d), float64(d.UtilizationPct)/100)
	}
	// 0 while the device gets no replicas: lost, or its memory unreadable.
	for _, d := range devs {
		vm.WriteGaugeUint64(w, "inferd_gpu_healthy"+lbl(d), boolGauge(d.Healthy()))
	}
}

// Serve answers GET /metrics. It needs no API key: the figures hold
// no inputs, outputs or secrets, only project ids, and Prometheus scrapes
// without credentials. Bind the API listener to loopback (or firewall it)
// where project ids must stay private.
func (m *Metrics) Serve(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	m.WritePrometheus(w)
}

func boolGauge(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

// labelValue escapes s for a Prometheus label value.
func labelValue(s string) string {
	if !strings.ContainsAny(s, "\\\"\n") {
		return s
	}
	return strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`).Replace(s)
}

// unmatchedRoute is the route label of requests no route matched.
const unmatchedRoute = "unmatched"

// Answered is a response writer that tells how its request was answered:
// the route pattern that took it ("" for none) and the status.
type Answered interface {
	Answered() (route string, status int)
}

// CountRequests counts every request by route pattern and status once it
// has been answered, as its writer (an Answered, the API's request log's
// recorder) tells. A nil m counts nothing.
func (m *Metrics) CountRequests(next http.Handler) http.Handler {
	if m == nil {
		return next
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			// Deferred, so that an aborted response (http.ErrAbortHandler)
			// counts too.
			route, status := unmatchedRoute, http.StatusOK
			if a, ok := w.(Answered); ok {
				if rt, st := a.Answered(); rt != "" {
					route, status = rt, st
				} else {
					status = st
				}
			}
			m.countRequest(route, status)
		}()
		next.ServeHTTP(w, r)
	})
}

// LongPollBegin counts a check that waits for its call as one of
// inferd_longpolls_in_flight, until the returned func is called. Checks that
// answer at once (no longPoll, or the call already finished) are not long
// polls and never count. A nil m counts nothing.
func (m *Metrics) LongPollBegin() (end func()) {
	if m == nil {
		return func() {}
	}
	m.longPolls.Add(1)
	return func() { m.longPolls.Add(-1) }
}
