package gpu

// Device is one GPU as inferd sees it: discovered through NVML or simulated.
type Device struct {
	Index          int    `json:"index"`
	UUID           string `json:"uuid"`
	Name           string `json:"name"`
	MemoryTotalMiB uint64 `json:"memoryTotalMiB"`
	MemoryFreeMiB  uint64 `json:"memoryFreeMiB"`
	UtilizationPct int    `json:"utilizationPct"`
	MIG            bool   `json:"mig"`
	Simulated      bool   `json:"simulated"`
	// Samples counts the successful NVML reads of this device (discovery
	// included); 0 for simulated GPUs. A read counted after an event has
	// happened reflects it: the scheduler waits for a higher count before it
	// trusts that a stopped replica's memory is back.
	Samples uint64 `json:"samples,omitempty"`
}
