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
}
