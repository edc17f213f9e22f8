package gpu

import (
	"fmt"

	"github.com/rs/zerolog"
)

// Defaults for fields left empty in a SimulatedGPU.
const (
	defaultSimulatedName      = "Simulated GPU"
	defaultSimulatedMemoryMiB = 16384
)

// SimulatedGPU describes one fake GPU from the gpu.simulate setting. An empty
// Name becomes "Simulated GPU" and a zero MemoryMiB becomes 16384.
type SimulatedGPU struct {
	Name      string `koanf:"name" json:"name" yaml:"name"`
	MemoryMiB uint64 `koanf:"memoryMiB" json:"memoryMiB" yaml:"memoryMiB"`
}

// Simulated returns an Inventory of fake GPUs, one per spec, indexed in spec
// order. Each gets a UUID derived from its index ("GPU-sim-0000-...",
// "GPU-sim-0001-..."), so the same config yields the same UUIDs on every
// start. Free memory always equals total and utilization 0: the scheduler
// tracks what it hands out itself (httpapi reports that as used memory).
func Simulated(specs []SimulatedGPU) *Inventory {
	devs := make([]Device, 0, len(specs))
	for idx, s := range specs {
		name := s.Name
		if name == "" {
			name = defaultSimulatedName
		}
		mem := s.MemoryMiB
		if mem == 0 {
			mem = defaultSimulatedMemoryMiB
		}
		devs = append(devs, Device{
			Index:          idx,
			UUID:           simulatedUUID(idx),
			Name:           name,
			Minor:          idx,
			MemoryTotalMiB: mem,
			MemoryFreeMiB:  mem,
			Simulated:      true,
		})
	}
	return newInventory(sourceSimulated, devs, nil, zerolog.Nop())
}

// simulatedUUID mimics the shape of an NVML UUID
// (GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx) while making it obvious that
// the GPU is not real.
func simulatedUUID(idx int) string {
	return fmt.Sprintf("GPU-sim-%04d-0000-0000-%012d", idx, idx)
}
