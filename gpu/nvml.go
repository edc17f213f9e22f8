//go:build cgo

package gpu

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/rs/zerolog"
)

// nvmlLib is the part of nvml.Interface that discovery uses. Keeping it this
// small makes the "call nothing after a failed Init" rule easy to check: a
// test double only has these methods (and the Device methods reached through
// DeviceGetHandleByIndex) to guard.
type nvmlLib interface {
	Init() nvml.Return
	Shutdown() nvml.Return
	SystemGetDriverVersion() (string, nvml.Return)
	DeviceGetCount() (int, nvml.Return)
	DeviceGetHandleByIndex(int) (nvml.Device, nvml.Return)
}

// Discover finds the box's NVIDIA GPUs through NVML. It never fails: with no
// driver or library it logs "no NVIDIA driver found: running on CPU only"
// once and returns an empty Inventory; any other Init failure is likewise
// one log line and an empty Inventory. A device whose queries fail is left
// out with a warning naming it. Call Close when done to shut NVML down.
func Discover(log zerolog.Logger) *Inventory {
	return discover(nvml.New(), log)
}

func discover(lib nvmlLib, log zerolog.Logger) *Inventory {
	// Invariant: nothing but Init may be called on lib until Init succeeds.
	// With no driver, any other call kills the process (exit 127).
	if ret := lib.Init(); ret != nvml.SUCCESS {
		switch ret {
		case nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED:
			log.Info().Str("nvml", ret.Error()).Msg("no NVIDIA driver found: running on CPU only")
		default:
			log.Warn().Err(ret).Msg("NVML init failed: running on CPU only")
		}
		return empty(log)
	}

	source := sourceNVML
	driver, ret := lib.SystemGetDriverVersion()
	if ret == nvml.SUCCESS && driver != "" {
		source = fmt.Sprintf("%s (driver %s)", sourceNVML, driver)
	}

	count, ret := lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		log.Warn().Err(ret).Msg("NVML device count failed: running on CPU only")
		lib.Shutdown() // best effort; we already log the failure that matters
		return empty(log)
	}

	b := &nvmlBackend{
		lib:     lib,
		log:     log,
		handles: make(map[string]nvml.Device, count),
		failing: make(map[string]bool),
	}
	devs := make([]Device, 0, count)
	for idx := range count {
		h, ret := lib.DeviceGetHandleByIndex(idx)
		if ret != nvml.SUCCESS {
			log.Warn().Int("index", idx).Err(ret).Msg("skipping GPU: get handle failed")
			continue
		}
		d, err := readDevice(h)
		if err != nil {
			ev := log.Warn().Int("index", idx)
			if d.UUID != "" {
				ev = ev.Str("uuid", d.UUID)
			}
			ev.Err(err).Msg("skipping GPU: query failed")
			continue
		}
		d.Samples = 1
		b.handles[d.UUID] = h
		devs = append(devs, d)
	}
	log.Info().Str("source", source).Int("gpus", len(devs)).Int("reported", count).Msg("NVML GPU discovery done")
	return newInventory(source, devs, b, log)
}

// readDevice queries everything inferd keeps about one GPU. On error the
// returned Device holds what was read so far (for the log line).
func readDevice(h nvml.Device) (Device, error) {
	var d Device
	uuid, ret := h.GetUUID()
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("get UUID: %w", ret)
	}
	d.UUID = uuid
	idx, ret := h.GetIndex()
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("get index: %w", ret)
	}
	d.Index = idx
	name, ret := h.GetName()
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("get name: %w", ret)
	}
	d.Name = name
	// GetMemoryInfo (v1) is in every driver. _v2 only splits reserved
	// memory out of "used"; total and free, all we need, are the same, so
	// it is not worth a symbol check.
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("get memory info: %w", ret)
	}
	d.MemoryTotalMiB = bytesToMiB(mem.Total)
	d.MemoryFreeMiB = bytesToMiB(mem.Free)
	util, err := readUtilization(h)
	if err != nil {
		return d, err
	}
	d.UtilizationPct = util
	current, _, ret := h.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		d.MIG = current == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
		// Pre-Ampere GPUs have no MIG: off.
	default:
		return d, fmt.Errorf("get MIG mode: %w", ret)
	}
	return d, nil
}

// readUtilization returns GPU utilization in percent. A GPU in MIG mode
// answers ERROR_NOT_SUPPORTED; that reads as 0, not as a failure.
func readUtilization(h nvml.Device) (int, error) {
	u, ret := h.GetUtilizationRates()
	switch ret {
	case nvml.SUCCESS:
		return int(u.Gpu), nil
	case nvml.ERROR_NOT_SUPPORTED:
		return 0, nil
	default:
		return 0, fmt.Errorf("get utilization: %w", ret)
	}
}

func bytesToMiB(b uint64) uint64 { return b >> 20 }

// nvmlBackend samples devices found by discover. NVML was initialised
// successfully before it was built.
type nvmlBackend struct {
	lib     nvmlLib
	log     zerolog.Logger
	handles map[string]nvml.Device // by UUID; read-only after discover

	// mu serialises sampling against Shutdown: handles are invalid after
	// Shutdown, so no query may start once closed is set.
	mu      sync.Mutex
	closed  bool
	failing map[string]bool // UUIDs whose last sample failed; logs once per failure streak
}

func (b *nvmlBackend) sample() map[string]sample {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	out := make(map[string]sample, len(b.handles))
	for uuid, h := range b.handles {
		s, err := sampleDevice(h)
		if err != nil {
			if !b.failing[uuid] {
				b.log.Warn().Str("uuid", uuid).Err(err).Msg("GPU refresh failed: keeping last known values")
				b.failing[uuid] = true
			}
			continue
		}
		if b.failing[uuid] {
			b.log.Info().Str("uuid", uuid).Msg("GPU refresh recovered")
			delete(b.failing, uuid)
		}
		out[uuid] = s
	}
	return out
}

func sampleDevice(h nvml.Device) (sample, error) {
	mem, ret := h.GetMemoryInfo()
	if ret != nvml.SUCCESS {
		return sample{}, fmt.Errorf("get memory info: %w", ret)
	}
	util, err := readUtilization(h)
	if err != nil {
		return sample{}, err
	}
	return sample{freeMiB: bytesToMiB(mem.Free), utilPct: util}, nil
}

func (b *nvmlBackend) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %w", ret)
	}
	return nil
}
