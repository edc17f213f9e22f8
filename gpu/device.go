package gpu

// Device is one placement unit as inferd sees it: a whole GPU, or one MIG
// device of a GPU in MIG mode (CUDA uses a MIG device only through its own
// MIG-<uuid>, never through its GPU's UUID), discovered through NVML or
// simulated.
type Device struct {
	// Index is the GPU's NVML index; for a MIG device, its GPU's index.
	Index int `json:"index"`
	// UUID pins the device: GPU-<uuid> for a GPU, MIG-<uuid> for a MIG
	// device, as NVML names them.
	UUID string `json:"uuid"`
	Name string `json:"name"`
	// Minor is the GPU's device minor number, as NVML's GetMinorNumber
	// gives it: its node is /dev/nvidia<Minor>, which is not always
	// /dev/nvidia<Index> (the index follows PCI order, the minor the
	// driver's probe order). A MIG device carries its GPU's minor.
	// Simulated GPUs take their index.
	Minor int `json:"minor"`
	// MemoryTotalMiB is all of the device's memory, as NVML counts it.
	MemoryTotalMiB uint64 `json:"memoryTotalMiB"`
	// DriverReservedMiB is what the driver and firmware keep for themselves
	// out of MemoryTotalMiB; no process can allocate it. Known only where
	// the driver has nvmlDeviceGetMemoryInfo_v2; 0 otherwise.
	DriverReservedMiB uint64 `json:"driverReservedMiB,omitempty"`
	MemoryFreeMiB     uint64 `json:"memoryFreeMiB"`
	UtilizationPct    int    `json:"utilizationPct"`
	// MIG: this is a MIG device; Parent is then its GPU's UUID.
	MIG    bool   `json:"mig"`
	Parent string `json:"parent,omitempty"`
	// CapMinors, for a MIG device, are the minors of the capability files
	// that open it (/dev/nvidia-caps/nvidia-cap<N>: its GPU instance's and
	// its compute instance's access files, as the driver's
	// /proc/driver/nvidia-caps/mig-minors maps them). Empty when that could
	// not be read: device rules then allow every capability file.
	CapMinors []int `json:"capMinors,omitempty"`
	Simulated bool  `json:"simulated"`
	// Problem says why the device is unhealthy ("" when healthy): lost
	// (NVML answered ERROR_GPU_IS_LOST: fallen off the bus), or its memory
	// could not be read. An unhealthy device keeps its last readings and
	// gets no new replicas; see Healthy.
	Problem string `json:"problem,omitempty"`
	// Processes are the compute processes NVML lists on the device at the
	// last read, with the memory each uses (its CUDA context included).
	// Empty when there are none, and when NVML does not say (simulated GPUs,
	// no permission).
	Processes []Process `json:"processes,omitempty"`
	// Samples counts the successful NVML reads of this device (discovery
	// included); 0 for simulated GPUs. A read counted after an event has
	// happened reflects it: the scheduler waits for a higher count before it
	// trusts that a stopped replica's memory is back.
	Samples uint64 `json:"samples,omitempty"`
}

// Process is one compute process on a device.
type Process struct {
	Pid int `json:"pid"`
	// UsedMiB is what it has allocated on the device; 0 when NVML does not
	// say (it answers "not available" without the needed privileges).
	UsedMiB uint64 `json:"usedMiB"`
}

// Healthy reports whether the device may get new replicas.
func (d Device) Healthy() bool { return d.Problem == "" }

// UsableMiB is the memory processes can allocate on the device: its total
// less what the driver reserves, where NVML tells that.
func (d Device) UsableMiB() uint64 {
	return d.MemoryTotalMiB - min(d.DriverReservedMiB, d.MemoryTotalMiB)
}
