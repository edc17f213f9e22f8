package backend

import "time"

// Metered is an Instance that can measure what its replica uses (its
// cgroup's CPU time and memory, its GPUs' energy) over a stretch of time:
// the usage ledger's per-call figures. The scheduler calls Measure as a
// call starts and the function it returns once the call has ended, both
// off its loop. An Instance that cannot measure is not Metered.
type Metered interface {
	Measure() (end func() Usage)
}

// Usage is what a replica used between Measure and its end. A measure the
// replica's box cannot take stays unknown (its Known false, or nil): the
// ledger then says absent, never zero.
type Usage struct {
	CPU      time.Duration // CPU time of the replica's whole process tree
	CPUKnown bool          // a cgroup counted it
	// PeakMemoryBytes is the replica's memory high-water mark over the
	// stretch where the kernel can reset it per reader (cgroup v2's
	// memory.peak), else since the replica started; 0 = not known.
	PeakMemoryBytes int64
	// EnergyJoules is what the replica's GPUs used (whole devices, as the
	// driver counts them); nil without an energy counter.
	EnergyJoules *float64
}
