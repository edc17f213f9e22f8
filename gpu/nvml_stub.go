//go:build !cgo

package gpu

import "github.com/rs/zerolog"

// Discover would find GPUs through NVML, but go-nvml needs cgo and this
// binary was built without it: it logs one warning and returns an empty
// Inventory.
func Discover(log zerolog.Logger) *Inventory {
	log.Warn().Msg("built without cgo: NVML GPU discovery disabled")
	return empty(log)
}
