package httpapi

import (
	"inferd/gpu"
	"inferd/scheduler"
)

// gpuMemory is one GPU's memory as the status endpoints and metrics report
// it, in bytes.
type gpuMemory struct {
	total, used, reserved uint64
}

// memoryOf reads d's memory. used is the driver's view (total − free), which
// lags behind placement while model servers load and free; reserved is what
// inferd has handed out on d (reservedMiB, by UUID, from the scheduler's
// Status). A simulated GPU has no driver, so its used memory is its
// reservation: demos show memory moving as replicas come and go. Its
// utilization is left at 0, since nothing really runs on it.
func memoryOf(d gpu.Device, reservedMiB map[string]uint64) gpuMemory {
	const mib = 1 << 20
	m := gpuMemory{
		total:    d.MemoryTotalMiB * mib,
		used:     (d.MemoryTotalMiB - min(d.MemoryFreeMiB, d.MemoryTotalMiB)) * mib,
		reserved: reservedMiB[d.UUID] * mib,
	}
	if d.Simulated {
		m.used = m.reserved
	}
	return m
}

// reservations indexes st's GPU hand-outs by UUID.
func reservations(st scheduler.Status) map[string]uint64 {
	out := make(map[string]uint64, len(st.GPUs))
	for _, g := range st.GPUs {
		out[g.UUID] = g.ReservedMiB
	}
	return out
}
