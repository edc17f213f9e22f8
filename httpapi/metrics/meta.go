package metrics

import (
	"bytes"
	"io"
	"strings"
)

// metricFamily is one metric family inferd exposes: its Prometheus type,
// its labels and the `# HELP` text. docs/metrics.md lists the same families
// (a test keeps the two in step).
type metricFamily struct {
	name   string
	typ    string // counter, gauge or histogram
	labels []string
	help   string
}

// Family is a metric family as docs/metrics.md lists it: its name, type
// and labels (its tests hold the two in step).
type Family struct {
	Name, Type string
	Labels     []string
	Help       string
}

// Families are every family /metrics writes, in the order written.
func Families() []Family {
	out := make([]Family, len(metricFamilies))
	for i, f := range metricFamilies {
		out[i] = Family{Name: f.name, Type: f.typ, Labels: f.labels, Help: f.help}
	}
	return out
}

// metricFamilies are every family /metrics writes, in the order written.
var metricFamilies = []metricFamily{
	{"inferd_calls_total", "counter", []string{"project", "outcome"},
		"Inference calls finished, by project and outcome (succeeded or failed)."},
	{"inferd_call_seconds", "histogram", []string{"project", "outcome"},
		"Latency of finished calls, from start to result, in seconds, by project and outcome."},
	{"inferd_call_queue_seconds", "histogram", []string{"project"},
		"Time a call waited in its project's queue before it reached a replica, in seconds."},
	{"inferd_call_boot_seconds", "histogram", []string{"project"},
		"Part of a call's queue time spent waiting for a replica to boot, in seconds."},
	{"inferd_call_run_seconds", "histogram", []string{"project"},
		"Time a replica spent on a call, from dispatch to answer, in seconds."},
	{"inferd_batch_size", "histogram", []string{"project"},
		"Calls per request sent to a replica of a project that batches (model.batch)."},
	{"inferd_batch_wait_seconds", "histogram", []string{"project"},
		"Time a batch waited for more calls before it was sent (0 when sent at once), in seconds."},
	{"inferd_replica_starts_total", "counter", []string{"project"},
		"Replica boots attempted (cold starts), by project."},
	{"inferd_replica_crashes_total", "counter", []string{"project"},
		"Replicas whose process exited without being asked to (failed launch, boot or serving), by project."},
	{"inferd_replica_evictions_total", "counter", []string{"project"},
		"Idle replicas stopped to free GPUs for another project, by project."},
	{"inferd_calls_cancelled_total", "counter", []string{"project"},
		"Calls ended by a cancel or a queue purge, by project."},
	{"inferd_calls_expired_total", "counter", []string{"project"},
		"Calls whose queueTimeout passed before they were dispatched, by project."},
	{"inferd_calls_retried_total", "counter", []string{"project"},
		"Calls run again (a new attempt, same callID) after a restart or a model crash, by project."},
	{"inferd_tokens_total", "counter", []string{"team", "project", "kind"},
		"Tokens an OpenAI-compatible model reported for finished calls (protocol openai), by team, project and kind (prompt or completion)."},
	{"inferd_replica_oom_kills_total", "counter", []string{"project"},
		"Replicas the kernel killed for going over their project's memoryMiB, by project."},
	{"inferd_replica_park_seconds", "histogram", []string{"project"},
		"Time an idle GPU replica took to park (its GPU memory moved to host memory, its processes frozen), in seconds."},
	{"inferd_replica_restore_seconds", "histogram", []string{"project"},
		"Time a parked replica took to restore onto its GPUs for a call, in seconds."},
	{"inferd_replica_park_failures_total", "counter", []string{"project"},
		"Parks that failed or outlasted bootTimeout: the replica was stopped and the project parks no more until its spec changes."},
	{"inferd_replica_restore_failures_total", "counter", []string{"project", "reason"},
		"Parked replicas that could not be restored (reason gpu_taken, failed or timeout): each was stopped and a cold boot served the call."},
	{"inferd_usage_calls_total", "counter", []string{"team", "project"},
		"Calls finished with a usage record (the usage ledger's calls), by team and project."},
	{"inferd_usage_replica_seconds_total", "counter", []string{"team", "project", "phase"},
		"Replica-seconds charged by the usage ledger, by team, project and phase: call (the calls' shares), boot, idle."},
	{"inferd_usage_gpu_seconds_total", "counter", []string{"team", "project", "phase"},
		"GPU-seconds (GPUs held, a memory share as its fraction of the GPU, times seconds), by team, project and phase."},
	{"inferd_usage_cpu_seconds_total", "counter", []string{"team", "project"},
		"CPU time of the replicas' cgroups over their calls, each call's share, in seconds (absent without cgroups)."},
	{"inferd_usage_bytes_total", "counter", []string{"team", "project", "direction"},
		"Bytes of call inputs (in) and outputs (out), by team and project."},
	{"inferd_usage_energy_joules_total", "counter", []string{"team", "project"},
		"GPU energy of the calls, each call's share of its replica's GPUs' counter, in joules (absent without NVML's energy counter)."},
	{"inferd_http_requests_total", "counter", []string{"route", "status"},
		"HTTP requests answered, by route pattern and status code."},
	{"inferd_longpolls_in_flight", "gauge", nil,
		"Check requests waiting on their call (long polls) right now."},
	{"inferd_budget_refusals_total", "counter", []string{"budget"},
		"Requests refused, and event streams cut, by a budget of the edge, named by its config key (docs/security.md, Budgets)."},
	{"inferd_admission_refusals_total", "counter", []string{"hook"},
		"Calls refused by an admission hook of the call path (a key's rate, its waits, its streams), named by its config key."},
	{"inferd_request_body_bytes", "gauge", nil,
		"Bytes of request bodies being read right now (the buffers holding them), against limits.bodyBytes."},
	{"inferd_event_streams", "gauge", nil,
		"Event streams (GET /v1/calls/:id/events) open right now."},
	{"inferd_event_stream_result_bytes", "gauge", nil,
		"Bytes of finished calls' results held for event streams right now, each counted once, against limits.streamResultBytes."},
	{"inferd_queue_depth", "gauge", []string{"project"},
		"Calls waiting in each project's queue right now."},
	{"inferd_replicas", "gauge", []string{"project", "state"},
		"Replicas of each project by state (booting, ready, busy, stopping, parking, parked, restoring) right now."},
	{"inferd_gpu_memory_total_bytes", "gauge", []string{"gpu", "uuid"},
		"Memory of each GPU, in bytes."},
	{"inferd_gpu_memory_used_bytes", "gauge", []string{"gpu", "uuid"},
		"Memory in use on each GPU as its driver reports it (a simulated GPU: inferd's reservation), in bytes."},
	{"inferd_gpu_memory_reserved_bytes", "gauge", []string{"gpu", "uuid"},
		"Memory inferd has handed out to replicas on each GPU, in bytes."},
	{"inferd_gpu_utilization_ratio", "gauge", []string{"gpu", "uuid"},
		"Each GPU's utilization as its driver reports it, 0 to 1 (0 for a simulated GPU)."},
	{"inferd_gpu_healthy", "gauge", []string{"gpu", "uuid"},
		"1 while the GPU reads normally, 0 while it is lost or unreadable (no new replicas are placed on it)."},
	{"inferd_connections_open", "gauge", nil,
		"Client connections to the API open right now."},
	{"inferd_connections_max", "gauge", nil,
		"The cap on open API connections (limits.maxConnections, or sized from the open-file limit)."},
	{"inferd_connections_closed_for_room_total", "counter", nil,
		"API connections still sending a request, or idle, closed to make room for new ones at the cap."},
	{"inferd_connections_sending", "gauge", nil,
		"Open API connections still sending a request (its headers or its body): the first closed for room at the cap."},
	{"inferd_connections_reserved", "gauge", nil,
		"Open API connections on the reserve kept for /healthz, /readyz and /metrics while every other is being served."},
	{"inferd_store_file_bytes", "gauge", nil,
		"Size of the data file, in bytes."},
	{"inferd_store_commits_total", "counter", nil,
		"Write transactions committed to the data file."},
	{"inferd_store_commit_seconds_total", "counter", nil,
		"Time spent committing write transactions (fsync included), in seconds."},
	{"inferd_webhook_deliveries_total", "counter", []string{"result"},
		"Webhook messages ended, by result (delivered; gave_up after webhook.retryFor or at a refused destination; dropped by webhook.maxPendingPerTeam)."},
	{"inferd_webhook_retries_total", "counter", nil,
		"Webhook attempts that failed and will be retried."},
	{"inferd_webhook_pending", "gauge", nil,
		"Webhook messages queued in the outbox, not yet delivered or given up."},
	{"inferd_webhook_team_pending", "gauge", []string{"team"},
		"A team's webhook messages in the outbox, not yet ended (capped by webhook.maxPendingPerTeam)."},
	{"inferd_webhook_team_sending", "gauge", []string{"team"},
		"A team's webhook attempts in flight (at most webhook.sendersPerTeam)."},
	{"inferd_webhook_team_dropped_total", "counter", []string{"team"},
		"A team's webhook messages dropped unsent, oldest first, because it held more than webhook.maxPendingPerTeam."},
	{"inferd_cluster_nodes", "gauge", nil,
		"Live nodes of the cluster as this node sees them (cluster mode only)."},
	{"inferd_cluster_leader", "gauge", nil,
		"1 while this node is the cluster's leader, else 0 (cluster mode only)."},
}

// familyOf returns the family a sample line belongs to: its metric name, or
// for a histogram's _bucket, _sum and _count series, the histogram's name.
func familyOf(line string, known map[string]*metricFamily) string {
	name := line
	if i := strings.IndexAny(line, "{ "); i >= 0 {
		name = line[:i]
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suffix); ok {
			if f := known[base]; f != nil && f.typ == "histogram" {
				return base
			}
		}
	}
	return name
}

// writeWithMetadata copies the sample lines of text to w, grouped by family
// (in order of first appearance) and each group headed by its `# HELP` and
// `# TYPE` lines, as promtool and the exposition format expect: one TYPE
// per family, all its samples together.
//
// VictoriaMetrics/metrics has a switch for metadata (ExposeMetadata), but
// it is package-global, writes an empty HELP, and writes a TYPE line with
// every WriteGauge call, which repeats it for each project's series; so
// inferd adds the metadata itself from metricFamilies. A family missing
// there is written as untyped, without help (a test makes sure none is).
// A node other than "" is added to every sample as its first label (cluster
// mode).
func writeWithMetadata(w io.Writer, text []byte, node string) {
	known := make(map[string]*metricFamily, len(metricFamilies))
	for i := range metricFamilies {
		known[metricFamilies[i].name] = &metricFamilies[i]
	}
	var order []string
	groups := map[string][]byte{}
	for line := range bytes.Lines(text) {
		s := strings.TrimSpace(string(line))
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		fam := familyOf(s, known)
		if _, ok := groups[fam]; !ok {
			order = append(order, fam)
		}
		if node != "" {
			s = withNode(s, node)
		}
		groups[fam] = append(append(groups[fam], s...), '\n')
	}
	var out bytes.Buffer
	for _, fam := range order {
		if f := known[fam]; f != nil {
			out.WriteString("# HELP " + fam + " " + helpText(f.help) + "\n")
			out.WriteString("# TYPE " + fam + " " + f.typ + "\n")
		} else {
			out.WriteString("# TYPE " + fam + " untyped\n")
		}
		out.Write(groups[fam])
	}
	_, _ = w.Write(out.Bytes()) // a scrape that hung up has nobody to tell
}

// withNode adds node="<node>" as the first label of a sample line: a
// metric name cannot hold '{' or ' ', so the first of them ends the name.
func withNode(line, node string) string {
	i := strings.IndexAny(line, "{ ")
	if i < 0 {
		return line // not a sample line: left as it is
	}
	lbl := `node="` + labelValue(node) + `"`
	if line[i] == '{' {
		if strings.HasPrefix(line[i+1:], "}") {
			return line[:i+1] + lbl + line[i+1:]
		}
		return line[:i+1] + lbl + "," + line[i+1:]
	}
	return line[:i] + "{" + lbl + "}" + line[i:]
}

// helpText escapes s for a HELP line: backslash and newline only.
func helpText(s string) string {
	return strings.NewReplacer(`\`, `\\`, "\n", `\n`).Replace(s)
}
