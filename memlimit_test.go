package main

import (
	"math"
	"runtime/debug"
	"testing"

	"github.com/rs/zerolog"

	"inferd/config"
)

// The daemon's soft memory limit is what lets the collector reclaim a
// large reply's copies before the heap doubles (docs/benchmarks.md,
// "Budgets at every door"); these read it back from the runtime.
func TestSetMemoryLimitAppliesTheLimit(t *testing.T) {
	defaults, err := config.Load("", nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	const derived = 320 << 20 // bodyBytes + replyBytes + 64 MiB at the defaults (docs/configuration.md)
	tests := []struct {
		name   string
		limits func(l config.Limits) config.Limits
		env    string // GOMEMLIMIT
		want   int64
	}{
		{"derived from the budgets by default", func(l config.Limits) config.Limits { return l }, "", derived},
		{"limits.memoryBytes", func(l config.Limits) config.Limits { l.MemoryBytes = 300 << 20; return l }, "", 300 << 20},
		{"none with an unbounded reply budget", func(l config.Limits) config.Limits { l.ReplyBytes = 0; return l }, "", math.MaxInt64},
		{"GOMEMLIMIT left as the runtime has it", func(l config.Limits) config.Limits { l.MemoryBytes = 300 << 20; return l }, "1GiB", 123 << 20},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			old := debug.SetMemoryLimit(123 << 20) // what the runtime took from GOMEMLIMIT, in the last case
			t.Cleanup(func() { debug.SetMemoryLimit(old) })
			getenv := func(name string) string {
				if name == "GOMEMLIMIT" {
					return tc.env
				}
				return ""
			}
			got := setMemoryLimit(tc.limits(defaults.Limits), getenv, zerolog.Nop())
			if applied := debug.SetMemoryLimit(-1); got != tc.want || applied != tc.want {
				t.Errorf("setMemoryLimit = %d, runtime has %d; want %d", got, applied, tc.want)
			}
		})
	}
}
