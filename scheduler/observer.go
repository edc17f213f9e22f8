package scheduler

import (
	"time"

	"inferd/store"
)

// Observer is told about events worth counting, for metrics. Its methods run
// on the scheduler's loop goroutine: they must be quick and never block.
type Observer interface {
	// CallFinished reports a call whose final result is durable (or whose
	// final write failed: then it is reported failed).
	CallFinished(c store.Call)
	// ReplicaStarted reports a replica being booted (a launch attempt).
	ReplicaStarted(project string)
	// ReplicaCrashed reports a replica whose process ended without being
	// asked to: a failed launch, a crash while booting, or while serving.
	ReplicaCrashed(project string)
	// ReplicaEvicted reports an idle replica stopped to make room for
	// another project.
	ReplicaEvicted(project string)
	// CallCancelled reports a call ended by a cancel or a queue purge,
	// CallExpired one whose queueTimeout passed before it was dispatched,
	// and CallRetried one run again after a restart or a model crash.
	CallCancelled(project string)
	CallExpired(project string)
	CallRetried(project string)
	// ReplicaOOMKilled reports a replica the kernel killed for going over
	// its project's memoryMiB.
	ReplicaOOMKilled(project string)
	// ReplicaUsage reports the replica time no call used (boot, idle) as
	// the scheduler writes it to the usage ledger, by hour, team and
	// project; a call's own usage comes with CallFinished.
	ReplicaUsage(rows []store.UsageRow)
	// BatchDispatched reports a batch of size calls sent to a replica of a
	// project that batches, after waiting wait for it to fill.
	BatchDispatched(project string, size int, wait time.Duration)
}

// nopObserver is the Observer of a Config that sets none.
type nopObserver struct{}

func (nopObserver) CallFinished(store.Call)       {}
func (nopObserver) ReplicaStarted(string)         {}
func (nopObserver) ReplicaCrashed(string)         {}
func (nopObserver) ReplicaEvicted(string)         {}
func (nopObserver) CallCancelled(string)          {}
func (nopObserver) CallExpired(string)            {}
func (nopObserver) CallRetried(string)            {}
func (nopObserver) ReplicaOOMKilled(string)       {}
func (nopObserver) ReplicaUsage([]store.UsageRow) {}

func (nopObserver) BatchDispatched(string, int, time.Duration) {}
