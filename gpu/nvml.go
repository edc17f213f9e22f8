//go:build cgo

package gpu

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
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
	Extensions() nvml.ExtendedInterface
}

// memInfoV2Symbol is the optional entry point that splits driver-reserved
// memory out of "used". Drivers older than about R510 lack it, and calling a
// missing symbol kills the process, so it is looked up first.
const memInfoV2Symbol = "nvmlDeviceGetMemoryInfo_v2"

// Discover finds the box's NVIDIA GPUs and MIG devices through NVML. It
// never fails: with no driver or library it logs "no NVIDIA driver found:
// running on CPU only" once and returns an empty Inventory, whose Run keeps
// trying in the background (inferd may start before the driver); any other
// Init failure is likewise one log line. A device that cannot be identified
// is left out with a warning naming it. Call Close when done to shut NVML
// down.
func Discover(log zerolog.Logger) *Inventory {
	return discover(nvml.New(), migMinorsFile, log)
}

// migMinorsFile maps MIG GPU and compute instances to the minors of their
// capability files (/dev/nvidia-caps/nvidia-cap<N>).
const migMinorsFile = "/proc/driver/nvidia-caps/mig-minors"

// discover is Discover on lib, with the driver's MIG capability map read
// from migMinors.
func discover(lib nvmlLib, migMinors string, log zerolog.Logger) *Inventory {
	b := &nvmlBackend{lib: lib, log: log, migMinors: migMinors, failing: map[string]bool{}}
	s, err := b.enumerate()
	if err != nil {
		var ie initError
		switch {
		case errors.As(err, &ie) && (ie.ret == nvml.ERROR_LIBRARY_NOT_FOUND || ie.ret == nvml.ERROR_DRIVER_NOT_LOADED):
			log.Info().Str("nvml", ie.ret.Error()).Msg("no NVIDIA driver found: running on CPU only")
		case errors.As(err, &ie):
			log.Warn().Err(ie.ret).Msg("NVML init failed: running on CPU only")
		default:
			log.Warn().Err(err).Msg("NVML device count failed: running on CPU only")
		}
		inv := newInventory(sourceNone, nil, b, log)
		inv.retry = true
		return inv
	}
	logScan(log, s)
	inv := newInventory(s.source, s.devices, b, log)
	inv.missing = s.missing
	return inv
}

// initError is a failed nvmlInit: until a later Init succeeds, nothing else
// may be called.
type initError struct{ ret nvml.Return }

func (e initError) Error() string { return "nvml init: " + e.ret.Error() }

// nvmlBackend reads devices through NVML.
type nvmlBackend struct {
	lib       nvmlLib
	log       zerolog.Logger
	migMinors string // the driver's MIG capability map (migMinorsFile)

	// mu serialises every NVML call: sampling, enumeration (which may shut
	// NVML down and start it again) and Close. Handles are invalid after
	// Shutdown, so none is used once closed is set or up is cleared.
	mu      sync.Mutex
	closed  bool
	up      bool                   // Init succeeded and no Shutdown since
	memV2   bool                   // memInfoV2Symbol exists
	handles map[string]nvml.Device // by UUID, from the last enumeration
	failing map[string]bool        // "UUID query" whose last read failed; logs once per failure streak
	// warned and warning: the troubles the previous and the current
	// enumeration warned about. Enumeration is retried with backoff while
	// there is trouble; the same trouble is worth one line per streak.
	warned, warning map[string]bool
}

// enumerate starts NVML (shutting it down first if it is up, so that a GPU
// reset or a MIG change is seen afresh) and lists every placement unit: each
// GPU, or for a GPU in MIG mode each of its MIG devices.
//
// Invariant: nothing but Init is called on lib until Init has succeeded.
// With no driver, any other call kills the process (exit 127).
func (b *nvmlBackend) enumerate() (scan, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return scan{}, errors.New("nvml: closed")
	}
	if b.up {
		b.lib.Shutdown() // best effort: the next Init tells whether NVML works
		b.up, b.handles = false, nil
	}
	if ret := b.lib.Init(); ret != nvml.SUCCESS {
		return scan{}, initError{ret}
	}
	b.up = true
	b.warning = map[string]bool{}
	defer func() { b.warned = b.warning }()
	// GetMemoryInfo_v2 needs a symbol check; LookupSymbol only looks in the
	// library Init has loaded.
	b.memV2 = b.lib.Extensions().LookupSymbol(memInfoV2Symbol) == nil

	s := scan{source: sourceNVML}
	if driver, ret := b.lib.SystemGetDriverVersion(); ret == nvml.SUCCESS && driver != "" {
		s.source = fmt.Sprintf("%s (driver %s)", sourceNVML, driver)
	}
	count, ret := b.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		b.lib.Shutdown() // best effort; the count failure is what matters
		b.up = false
		return scan{}, fmt.Errorf("nvml device count: %w", ret)
	}
	s.reported = count
	b.handles = make(map[string]nvml.Device, count)
	for idx := range count {
		h, ret := b.lib.DeviceGetHandleByIndex(idx)
		if ret != nvml.SUCCESS {
			b.warn(fmt.Sprint("handle ", idx, ret)).Int("index", idx).Err(ret).Msg("skipping GPU: get handle failed")
			s.missing++
			continue
		}
		d, err := readGPU(h)
		if err != nil {
			ev := b.warn(fmt.Sprint("query ", idx, err)).Int("index", idx)
			if d.UUID != "" {
				ev = ev.Str("uuid", d.UUID)
			}
			ev.Err(err).Msg("skipping GPU: query failed")
			s.missing++
			continue
		}
		if !b.migMode(h, d) {
			s.devices = append(s.devices, b.unit(h, d))
			continue
		}
		migs := b.migDevices(h, d)
		if len(migs) == 0 {
			b.warn("no MIG devices "+d.UUID).Int("index", d.Index).Str("uuid", d.UUID).
				Msg("GPU is in MIG mode but has no MIG devices: it gets no replicas until GPU and compute instances are created (nvidia-smi mig -cgi ... -C) or MIG mode is turned off")
		}
		s.devices = append(s.devices, migs...)
	}
	return s, nil
}

// readGPU reads what identifies a GPU. On error the returned Device holds
// what was read so far (for the log line).
func readGPU(h nvml.Device) (Device, error) {
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
	// The minor number names the device node a replica's device cgroup
	// allows (scheduler/backend/local/devices.go).
	minor, ret := h.GetMinorNumber()
	if ret != nvml.SUCCESS {
		return d, fmt.Errorf("get minor number: %w", ret)
	}
	d.Minor = minor
	return d, nil
}

// migMode reports whether MIG mode is on. The query is optional: pre-Ampere
// GPUs answer NOT_SUPPORTED, and any other failure is logged and read as
// off, so the GPU is still used whole.
func (b *nvmlBackend) migMode(h nvml.Device, d Device) bool {
	current, _, ret := h.GetMigMode()
	switch ret {
	case nvml.SUCCESS:
		return current == nvml.DEVICE_MIG_ENABLE
	case nvml.ERROR_NOT_SUPPORTED:
		return false
	default:
		b.warn(fmt.Sprint("MIG mode ", d.UUID, ret)).Int("index", d.Index).Str("uuid", d.UUID).Err(ret).Msg("MIG mode query failed: using the GPU whole")
		return false
	}
}

// migDevices lists the MIG devices of a GPU in MIG mode, as units of their
// own. A slot without a MIG device answers NOT_FOUND.
func (b *nvmlBackend) migDevices(h nvml.Device, gpu Device) []Device {
	n, ret := h.GetMaxMigDeviceCount()
	if ret != nvml.SUCCESS {
		b.warn(fmt.Sprint("MIG count ", gpu.UUID, ret)).Int("index", gpu.Index).Str("uuid", gpu.UUID).Err(ret).Msg("skipping MIG GPU: MIG device count failed")
		return nil
	}
	var out []Device
	for k := range n {
		mh, ret := h.GetMigDeviceHandleByIndex(k)
		if ret == nvml.ERROR_NOT_FOUND {
			continue
		}
		if ret != nvml.SUCCESS {
			b.warn(fmt.Sprint("MIG handle ", gpu.UUID, k, ret)).Int("index", gpu.Index).Int("mig", k).Err(ret).Msg("skipping MIG device: get handle failed")
			continue
		}
		uuid, ret := mh.GetUUID()
		if ret != nvml.SUCCESS {
			b.warn(fmt.Sprint("MIG UUID ", gpu.UUID, k, ret)).Int("index", gpu.Index).Int("mig", k).Err(ret).Msg("skipping MIG device: get UUID failed")
			continue
		}
		name, ret := mh.GetName()
		if ret != nvml.SUCCESS || name == "" {
			name = gpu.Name + " MIG"
		}
		d := Device{Index: gpu.Index, UUID: uuid, Name: name, Minor: gpu.Minor, MIG: true, Parent: gpu.UUID}
		d.CapMinors = b.migCaps(mh, d)
		out = append(out, b.unit(mh, d))
	}
	return out
}

// migCaps are the minors of the capability files that open MIG device d
// (handle mh): its GPU instance's and its compute instance's access files,
// looked up in the driver's MIG capability map by d's GPU minor and
// instance ids, as the NVIDIA container toolkit does. nil, with a warning,
// when that cannot be told: the replica's device rules then allow every
// capability file of the box.
func (b *nvmlBackend) migCaps(mh nvml.Device, d Device) []int {
	gi, ret := mh.GetGpuInstanceId()
	if ret != nvml.SUCCESS {
		b.warn(fmt.Sprint("MIG GI ", d.UUID, ret)).Str("uuid", d.UUID).Err(ret).Msg("MIG device: GPU instance id unknown, so its replicas may open every MIG capability file")
		return nil
	}
	ci, ret := mh.GetComputeInstanceId()
	if ret != nvml.SUCCESS {
		b.warn(fmt.Sprint("MIG CI ", d.UUID, ret)).Str("uuid", d.UUID).Err(ret).Msg("MIG device: compute instance id unknown, so its replicas may open every MIG capability file")
		return nil
	}
	data, err := os.ReadFile(b.migMinors)
	if err != nil {
		b.warn("MIG minors " + err.Error()).Err(err).Msg("MIG capability map unreadable, so MIG replicas may open every MIG capability file")
		return nil
	}
	minors := map[string]int{}
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if n, err := strconv.Atoi(f[1]); err == nil {
			minors[f[0]] = n
		}
	}
	giCap, ok1 := minors[fmt.Sprintf("gpu%d/gi%d/access", d.Minor, gi)]
	ciCap, ok2 := minors[fmt.Sprintf("gpu%d/gi%d/ci%d/access", d.Minor, gi, ci)]
	if !ok1 || !ok2 {
		b.warn(fmt.Sprint("MIG caps ", d.UUID)).Str("uuid", d.UUID).Str("file", b.migMinors).
			Msg("MIG device not in the capability map, so its replicas may open every MIG capability file")
		return nil
	}
	return []int{giCap, ciCap}
}

// unit completes d with a first reading and keeps its handle. A unit whose
// memory cannot be read is listed all the same, unhealthy: it may recover.
func (b *nvmlBackend) unit(h nvml.Device, d Device) Device {
	b.handles[d.UUID] = h
	s := b.read(d.UUID, h)
	if s.problem != "" {
		b.warn("unhealthy "+d.UUID+" "+s.problem).Int("index", d.Index).Str("uuid", d.UUID).Str("problem", s.problem).
			Msg("GPU unhealthy: no replicas on it until it reads well")
		d.Problem = s.problem
		return d
	}
	s.apply(&d)
	return d
}

func (b *nvmlBackend) sample() map[string]sample {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || !b.up {
		return nil
	}
	out := make(map[string]sample, len(b.handles))
	for uuid, h := range b.handles {
		out[uuid] = b.read(uuid, h)
	}
	return out
}

// energy reads the device's total-energy counter. Any failure, NOT_SUPPORTED
// above all (MIG devices, GPUs before Volta), is "no counter": the caller
// reports energy as absent. Nothing is logged: a box without the counter
// would log on every call.
func (b *nvmlBackend) energy(uuid string) (uint64, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	h, ok := b.handles[uuid]
	if b.closed || !b.up || !ok {
		return 0, false
	}
	mj, ret := h.GetTotalEnergyConsumption()
	return mj, ret == nvml.SUCCESS
}

// read samples one device. Only memory is essential; utilization and the
// process list are optional, and their failures are logged once per streak.
// The caller holds b.mu.
func (b *nvmlBackend) read(uuid string, h nvml.Device) sample {
	var s sample
	total, reserved, free, ret := b.memory(h)
	if ret != nvml.SUCCESS {
		s.problem = problemOf("memory read failed", ret)
		return s
	}
	s.totalMiB, s.reservedMiB, s.freeMiB = bytesToMiB(total), bytesToMiB(reserved), bytesToMiB(free)

	u, ret := h.GetUtilizationRates()
	switch ret {
	case nvml.SUCCESS:
		s.utilPct, s.utilKnown = int(u.Gpu), true
	case nvml.ERROR_NOT_SUPPORTED:
		// MIG devices and GPUs in MIG mode have no utilization: 0.
		s.utilKnown = true
	}
	b.streak(uuid, "utilization", ret)

	procs, ret := h.GetComputeRunningProcesses()
	switch ret {
	case nvml.SUCCESS:
		for _, p := range procs {
			used := p.UsedGpuMemory
			if used == ^uint64(0) {
				used = 0 // NVML_VALUE_NOT_AVAILABLE: not allowed to see it
			}
			s.procs = append(s.procs, Process{Pid: int(p.Pid), UsedMiB: bytesToMiB(used)})
		}
	case nvml.ERROR_GPU_IS_LOST:
		s.problem = problemOf("", ret)
	}
	b.streak(uuid, "processes", ret)
	return s
}

// memory reads total, driver-reserved and free memory: through
// GetMemoryInfo_v2 where the driver has it, since v1 counts reserved memory
// as used and so overstates what can be allocated; else through v1, with
// reserved unknown (0).
func (b *nvmlBackend) memory(h nvml.Device) (total, reserved, free uint64, ret nvml.Return) {
	if b.memV2 {
		m, ret := h.GetMemoryInfo_v2()
		switch ret {
		case nvml.SUCCESS:
			return m.Total, m.Reserved, m.Free, ret
		case nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_FUNCTION_NOT_FOUND, nvml.ERROR_ARGUMENT_VERSION_MISMATCH:
			// The symbol exists but this device or driver does not serve
			// it: v1 does.
		default:
			return 0, 0, 0, ret
		}
	}
	m, ret := h.GetMemoryInfo()
	return m.Total, 0, m.Free, ret
}

// streak logs an optional query's failure once per failure streak, and its
// recovery. NOT_SUPPORTED and NO_PERMISSION are answers, not failures.
func (b *nvmlBackend) streak(uuid, query string, ret nvml.Return) {
	key := uuid + " " + query
	switch ret {
	case nvml.SUCCESS, nvml.ERROR_NOT_SUPPORTED, nvml.ERROR_NO_PERMISSION:
		if b.failing[key] {
			b.log.Info().Str("uuid", uuid).Str("query", query).Msg("GPU query recovered")
			delete(b.failing, key)
		}
	default:
		if !b.failing[key] {
			b.log.Warn().Str("uuid", uuid).Str("query", query).Err(ret).Msg("GPU query failed: keeping the last value")
			b.failing[key] = true
		}
	}
}

// warn returns a warning event the first time an enumeration meets key's
// trouble after one that did not, and a nil event (which logs nothing)
// while the trouble lasts. The caller holds b.mu, inside enumerate.
func (b *nvmlBackend) warn(key string) *zerolog.Event {
	b.warning[key] = true
	if b.warned[key] {
		return nil
	}
	return b.log.Warn()
}

// problemOf words an essential read's failure as a Device.Problem.
func problemOf(what string, ret nvml.Return) string {
	if ret == nvml.ERROR_GPU_IS_LOST {
		return "lost (" + ret.Error() + ")"
	}
	return what + " (" + ret.Error() + ")"
}

func bytesToMiB(b uint64) uint64 { return b >> 20 }

func (b *nvmlBackend) close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return nil
	}
	b.closed = true
	if !b.up {
		return nil // Init never succeeded (or NVML is down): nothing to shut
	}
	b.up = false
	if ret := b.lib.Shutdown(); ret != nvml.SUCCESS {
		return fmt.Errorf("nvml shutdown: %w", ret)
	}
	return nil
}
