package gpu

import "github.com/rs/zerolog"

// Open returns the inventory the gpu.* settings ask for: the simulated GPUs
// when simulate lists some, none when disabled, else what NVML finds. serve
// and the commands that check a project against the machine (apply, doctor)
// share it, so that they see the same GPUs. Call Close when done.
func Open(simulate []SimulatedGPU, disabled bool, log zerolog.Logger) *Inventory {
	switch {
	case len(simulate) > 0:
		log.Info().Int("count", len(simulate)).Msg("using simulated GPUs")
		return Simulated(simulate)
	case disabled:
		log.Info().Msg("GPU discovery disabled: running on CPU only")
		return Simulated(nil)
	default:
		return Discover(log)
	}
}
