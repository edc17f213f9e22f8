package main

import (
	"math"
	"runtime/debug"

	"github.com/rs/zerolog"

	"inferd/config"
)

// setMemoryLimit gives the Go collector the daemon's soft memory limit
// (config.Limits.MemoryLimit says why one is needed) and returns it, or
// leaves the runtime's as it is and returns that when the operator set
// GOMEMLIMIT in the environment: the runtime read it at start, and an
// operator who sets it (or "off") means it. getenv is os.Getenv.
func setMemoryLimit(limits config.Limits, getenv func(string) string, log zerolog.Logger) int64 {
	if getenv("GOMEMLIMIT") != "" {
		n := debug.SetMemoryLimit(-1) // reads it, changes nothing
		log.Info().Int64("bytes", n).Msg("memory limit from GOMEMLIMIT")
		return n
	}
	n := limits.MemoryLimit()
	debug.SetMemoryLimit(n)
	if n < math.MaxInt64 {
		log.Info().Int64("bytes", n).Msg("memory limit for the collector (limits.memoryBytes)")
	}
	return n
}
