package metrics

import (
	"time"

	"inferd/scheduler"
)

// Parking's metrics (docs/gpu.md "Parking"): how long parks and restores
// take, and how often they fail. Parked replicas themselves are
// inferd_replicas{state="parked"}.

var _ scheduler.ParkObserver = (*Metrics)(nil)

// parkBuckets are the upper bounds, in seconds, of the park and restore
// histograms: from a freeze with nothing to copy (ms) to tens of GiB moved
// between GPU and host memory (tens of seconds).
var parkBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120}

// ReplicaParked records how long a replica took to park.
func (m *Metrics) ReplicaParked(project string, took time.Duration) {
	m.set.GetOrCreatePrometheusHistogramExt(`inferd_replica_park_seconds{project="`+labelValue(project)+`"}`, parkBuckets).Update(took.Seconds())
}

// ReplicaRestored records how long a parked replica took to restore.
func (m *Metrics) ReplicaRestored(project string, took time.Duration) {
	m.set.GetOrCreatePrometheusHistogramExt(`inferd_replica_restore_seconds{project="`+labelValue(project)+`"}`, parkBuckets).Update(took.Seconds())
}

// ParkFailed counts a park that failed (the replica was stopped).
func (m *Metrics) ParkFailed(project string) {
	m.projectCounter("inferd_replica_park_failures_total", project)
}

// RestoreFailed counts a parked replica that could not be restored, by why
// (scheduler.RestoreGPUTaken, RestoreError, RestoreTimedOut).
func (m *Metrics) RestoreFailed(project, reason string) {
	m.set.GetOrCreateCounter(`inferd_replica_restore_failures_total{project="` + labelValue(project) + `",reason="` + labelValue(reason) + `"}`).Inc()
}
