package gpu

// Memory is one GPU's memory as the status endpoints and the metrics
// report it, in bytes.
type Memory struct {
	Total, Used, Reserved uint64
}

// MemoryOf reads d's memory. Used is the driver's view (total − free),
// which lags behind placement while model servers load and free; Reserved
// is what inferd has handed out on d (reservedMiB, by UUID: the
// scheduler's Status.ReservedMiB). A simulated GPU has no driver, so its
// used memory is its reservation: demos show memory moving as replicas
// come and go. Its utilization is left at 0, since nothing really runs on
// it.
func MemoryOf(d Device, reservedMiB map[string]uint64) Memory {
	const mib = 1 << 20
	m := Memory{
		Total:    d.MemoryTotalMiB * mib,
		Used:     (d.MemoryTotalMiB - min(d.MemoryFreeMiB, d.MemoryTotalMiB)) * mib,
		Reserved: reservedMiB[d.UUID] * mib,
	}
	if d.Simulated {
		m.Used = m.Reserved
	}
	return m
}
