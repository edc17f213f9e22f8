// Package gpu tells the rest of inferd which GPUs the box has: discovered
// through NVML, simulated from configuration, or none at all.
//
// The package exists mostly to contain NVML's sharp edges:
//
//   - go-nvml loads libnvidia-ml.so lazily. With no driver installed,
//     Init returns ERROR_LIBRARY_NOT_FOUND, and any other NVML call after a
//     failed Init dies inside the dynamic linker (undefined symbol, exit 127)
//     where recover cannot reach. The backend therefore calls nothing but
//     Init until Init has succeeded, and a box without a driver is an
//     ordinary CPU-only box: an empty Inventory and one info log line, never
//     a crash. Optional entry points (GetMemoryInfo_v2) are looked up before
//     use for the same reason.
//   - inferd may start before the driver has loaded, and a GPU may fall off
//     the bus (ERROR_GPU_IS_LOST). Inventory.Run retries NVML with backoff
//     while it has not started, and enumerates again (shutting NVML down and
//     starting it afresh) while a device is unhealthy. An unhealthy device
//     stays listed with its Problem and its last readings; the scheduler
//     places nothing on it.
//   - go-nvml needs cgo. Builds without cgo get a stub Discover that logs
//     once and returns an empty Inventory, so CGO_ENABLED=0 still compiles.
//   - Device handles are only valid between Init and Shutdown, so sampling,
//     enumeration and Close are serialised and nothing queries NVML after
//     Close.
//   - Only identity (UUID, index, name) and memory are essential. MIG mode,
//     utilization and the process list are optional: NOT_SUPPORTED means
//     "not applicable" (MIG GPUs have no utilization), and any other failure
//     is one warning per failure streak, never a dropped device.
//   - A GPU in MIG mode is not a placement unit: CUDA uses a MIG device only
//     through its MIG-<uuid>, one per process. Each MIG device is listed as
//     a Device of its own (MIG, with its GPU as Parent), and the GPU itself
//     is not.
//
// Simulated GPUs never change: the scheduler accounts for what it hands out
// itself, and the status page and metrics report that reservation as a
// simulated GPU's used memory.
package gpu
