// Package gpu tells the rest of inferd which GPUs the box has: discovered
// through NVML, simulated from configuration, or none at all.
//
// The package exists mostly to contain NVML's sharp edges:
//
//   - go-nvml loads libnvidia-ml.so lazily. With no driver installed,
//     Init returns ERROR_LIBRARY_NOT_FOUND, and any other NVML call after a
//     failed Init dies inside the dynamic linker (undefined symbol, exit 127)
//     where recover cannot reach. Discover therefore calls nothing but Init
//     until Init has succeeded, and a box without a driver is an ordinary
//     CPU-only box: an empty Inventory and one info log line, never a crash.
//   - go-nvml needs cgo. Builds without cgo get a stub Discover that logs
//     once and returns an empty Inventory, so CGO_ENABLED=0 still compiles.
//   - Device handles are only valid between Init and Shutdown, so the
//     refresh loop and Close are serialised and nothing queries NVML after
//     Close.
//   - A GPU in MIG mode answers ERROR_NOT_SUPPORTED for utilization, and
//     older GPUs do so for MIG mode; both mean "not applicable", not failure.
//     Any other failing query skips that one device with a warning, so one
//     sick GPU does not hide the healthy ones.
//
// Only free memory and utilization change after discovery; Inventory.Run
// refreshes them periodically. Simulated GPUs never change: the scheduler
// accounts for what it hands out itself, and the status page and metrics
// report that reservation as a simulated GPU's used memory.
package gpu
