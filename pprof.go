//go:build pprof

// A profiling build (go build -tags pprof) serves net/http/pprof on the
// address in INFERD_PPROF (e.g. 127.0.0.1:6060), with block and mutex
// profiling on, for the hot-path profiles in docs/benchmarks.md. Release
// builds leave this file out: no profiling endpoint, no sampling cost.
package main

import (
	"net/http"
	_ "net/http/pprof" // registers /debug/pprof/ on http.DefaultServeMux
	"os"
	"runtime"
)

func init() {
	addr := os.Getenv("INFERD_PPROF")
	if addr == "" {
		return
	}
	runtime.SetBlockProfileRate(10_000) // one sample per 10 µs blocked
	runtime.SetMutexProfileFraction(10)
	go func() {
		// A second daemon on the same address (the cluster step) goes without.
		_ = http.ListenAndServe(addr, nil)
	}()
}
