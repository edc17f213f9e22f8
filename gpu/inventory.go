package gpu

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Source names reported by Inventory.Source.
const (
	sourceNVML      = "nvml"
	sourceSimulated = "simulated"
	sourceNone      = "none"
)

// Rediscovery backoff: while NVML has not started, a device is unhealthy,
// or a GPU NVML counts could not be listed, Run enumerates the devices
// again after retryFirst, doubling up to retryMax.
const (
	retryFirst = time.Second
	retryMax   = time.Minute
)

// problemGone is the Problem of a GPU that a rediscovery no longer lists.
const problemGone = "lost (no longer listed by NVML)"

// Inventory is the set of devices inferd may place replicas on. NVML
// devices change through Run: free memory, utilization, processes and
// health at every refresh, and the set itself when a rediscovery finds a
// late driver, a GPU back from a reset or a changed MIG layout. All methods
// are safe for concurrent use.
type Inventory struct {
	log zerolog.Logger

	// backend reads live devices; nil for simulated and empty inventories,
	// whose devices never change.
	backend backend
	kick    chan struct{} // RefreshSoon → Run

	mu      sync.RWMutex
	source  string   // guarded by mu
	devices []Device // sorted by Index; guarded by mu
	// retry: NVML has not started (or stopped): Run retries it. Guarded by mu.
	retry bool
	// missing: GPUs NVML counted but could not list. Guarded by mu.
	missing int
}

// backend is what an Inventory needs from a live GPU library.
type backend interface {
	// enumerate (re)starts the library and lists every device.
	enumerate() (scan, error)
	// sample reads the volatile fields of the devices of the last
	// enumeration, keyed by UUID; nil when the library is not up.
	sample() map[string]sample
	// close releases the library; later samples return nothing.
	close() error
	// energy reads a device's total-energy counter, in millijoules since
	// the driver loaded; false when it has none (MIG devices, older
	// GPUs) or the library is not up.
	energy(uuid string) (uint64, bool)
}

// scan is one enumeration of NVML's devices.
type scan struct {
	source   string
	devices  []Device // placement units, Samples 1
	reported int      // GPUs NVML counted
	// missing counts the GPUs NVML counted that could not be listed (no
	// handle, or no UUID): worth looking for again.
	missing int
}

// sample is one reading of a device's volatile fields.
type sample struct {
	// problem is set when the essential read (memory) failed; nothing
	// else in the sample is then meaningful.
	problem                        string
	totalMiB, reservedMiB, freeMiB uint64
	utilPct                        int
	utilKnown                      bool // false: keep the last utilization
	procs                          []Process
}

// apply writes a successful sample into d and counts the read.
func (s sample) apply(d *Device) {
	d.MemoryTotalMiB, d.DriverReservedMiB, d.MemoryFreeMiB = s.totalMiB, s.reservedMiB, s.freeMiB
	if s.utilKnown {
		d.UtilizationPct = s.utilPct
	}
	d.Processes = s.procs
	d.Problem = ""
	d.Samples++
}

func logScan(log zerolog.Logger, s scan) {
	log.Info().Str("source", s.source).Int("gpus", len(s.devices)).Int("reported", s.reported).Msg("NVML GPU discovery done")
}

func newInventory(source string, devs []Device, b backend, log zerolog.Logger) *Inventory {
	devs = slices.Clone(devs)
	if devs == nil {
		devs = []Device{} // Devices() marshals as [], not null
	}
	sortDevices(devs)
	return &Inventory{source: source, log: log, backend: b, devices: devs, kick: make(chan struct{}, 1)}
}

// sortDevices orders by index; a GPU's MIG devices keep NVML's order.
func sortDevices(devs []Device) {
	slices.SortStableFunc(devs, func(a, b Device) int { return a.Index - b.Index })
}

// empty is the Inventory of a box with no usable GPU.
func empty(log zerolog.Logger) *Inventory {
	return newInventory(sourceNone, nil, nil, log)
}

// EnergyMillijoules reads the total-energy counter of the device with this
// UUID (NVML's nvmlDeviceGetTotalEnergyConsumption: millijoules since the
// driver loaded), for the usage ledger's energy figures. False when the
// device has no such counter (simulated GPUs, MIG devices, GPUs before
// Volta) or NVML is not up: energy is then absent, never zero.
func (i *Inventory) EnergyMillijoules(uuid string) (uint64, bool) {
	if i.backend == nil {
		return 0, false
	}
	return i.backend.energy(uuid)
}

// Devices returns a copy of the devices, sorted by index; never nil.
// Callers may modify the returned slice and the devices in it.
func (i *Inventory) Devices() []Device {
	i.mu.RLock()
	defer i.mu.RUnlock()
	out := slices.Clone(i.devices)
	for k := range out {
		out[k].Processes = slices.Clone(out[k].Processes)
	}
	return out
}

// Count returns the number of devices, healthy or not.
func (i *Inventory) Count() int {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return len(i.devices)
}

// Source says where the devices came from: "simulated", "none", or "nvml"
// followed by the driver version when NVML reported one, for example
// "nvml (driver 550.54.15)". It changes from "none" when a late driver is
// found.
func (i *Inventory) Source() string {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.source
}

// RefreshSoon asks Run to read the devices now rather than at the next
// interval: the scheduler calls it when a replica on a real GPU has exited,
// so that its memory shows back at once. It never blocks; requests made
// while one is pending are one request.
func (i *Inventory) RefreshSoon() {
	select {
	case i.kick <- struct{}{}:
	default:
	}
}

// Run refreshes the devices every interval (and on RefreshSoon) until ctx
// ends, then returns nil. While NVML has not started, a device is
// unhealthy, or a counted GPU could not be listed, it also enumerates the
// devices again with backoff (retryFirst doubling to retryMax). For
// simulated and empty inventories there is nothing to refresh and Run just
// waits for ctx. Run one Run at a time per Inventory.
func (i *Inventory) Run(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return fmt.Errorf("gpu refresh interval must be positive, got %v", every)
	}
	if i.backend == nil {
		<-ctx.Done()
		return nil
	}
	tick := time.NewTicker(every)
	defer tick.Stop()
	var (
		retryT *time.Timer
		retry  <-chan time.Time // armed while a rediscovery is due
		wait   = retryFirst
	)
	defer func() {
		if retryT != nil {
			retryT.Stop()
		}
	}()
	for {
		switch {
		case !i.needsRediscovery():
			wait = retryFirst
		case retry == nil:
			retryT = time.NewTimer(wait)
			retry = retryT.C
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
			i.refresh()
		case <-i.kick:
			i.refresh()
		case <-retry:
			retry = nil
			if i.needsRediscovery() { // a refresh may have healed it meanwhile
				i.rediscover()
				wait = min(2*wait, retryMax)
			}
		}
	}
}

// needsRediscovery reports whether enumerating again may find more.
func (i *Inventory) needsRediscovery() bool {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return i.retry || i.missing > 0 || slices.ContainsFunc(i.devices, func(d Device) bool { return !d.Healthy() })
}

// refresh applies one sample from the backend. Devices missing from the
// sample keep their last known values; a device whose memory read failed
// keeps them too, and is unhealthy until a read succeeds.
func (i *Inventory) refresh() {
	if i.backend == nil {
		return
	}
	s := i.backend.sample()
	i.mu.Lock()
	defer i.mu.Unlock()
	for k := range i.devices {
		d := &i.devices[k]
		v, ok := s[d.UUID]
		if !ok {
			continue
		}
		was := d.Problem
		if v.problem != "" {
			d.Problem = v.problem
		} else {
			v.apply(d)
		}
		i.logHealth(*d, was)
	}
}

// logHealth logs a device's change of health.
func (i *Inventory) logHealth(d Device, was string) {
	switch {
	case d.Problem == was:
	case d.Problem == "":
		i.log.Info().Int("index", d.Index).Str("uuid", d.UUID).Msg("GPU healthy again")
	default:
		i.log.Warn().Int("index", d.Index).Str("uuid", d.UUID).Str("problem", d.Problem).
			Msg("GPU unhealthy: no new replicas on it until it reads well again")
	}
}

// rediscover enumerates the devices again and merges the result: devices
// found keep counting their reads, new ones are added, MIG devices no
// longer listed are dropped (their MIG layout changed), and GPUs no longer
// listed stay, lost, so that the status still shows them.
func (i *Inventory) rediscover() {
	s, err := i.backend.enumerate()
	i.mu.Lock()
	defer i.mu.Unlock()
	if err != nil {
		if !i.retry {
			i.log.Warn().Err(err).Msg("NVML restart failed: no new replicas on GPUs until it starts")
		} else {
			i.log.Debug().Err(err).Msg("NVML still unavailable")
		}
		i.retry = true
		for k := range i.devices {
			if i.devices[k].Problem == "" {
				i.devices[k].Problem = "NVML unavailable (" + err.Error() + ")"
			}
		}
		return
	}
	old := make(map[string]Device, len(i.devices))
	for _, d := range i.devices {
		old[d.UUID] = d
	}
	next := make([]Device, 0, len(s.devices))
	for _, d := range s.devices {
		o, known := old[d.UUID]
		was := o.Problem
		delete(old, d.UUID)
		if known {
			if d.Problem != "" {
				// Unreadable now: keep the last readings, as refresh does.
				o.Index, o.Problem = d.Index, d.Problem
				d = o
			} else {
				// Samples only grows: the scheduler compares counts.
				d.Samples += o.Samples
			}
			i.logHealth(d, was)
		} else {
			i.log.Info().Int("index", d.Index).Str("uuid", d.UUID).Str("name", d.Name).Str("problem", d.Problem).Msg("GPU found")
		}
		next = append(next, d)
	}
	for _, o := range i.devices {
		if _, gone := old[o.UUID]; !gone || o.MIG {
			continue
		}
		was := o.Problem
		if !isLost(o.Problem) {
			o.Problem = problemGone
		}
		i.logHealth(o, was)
		next = append(next, o)
	}
	sortDevices(next)
	if i.retry {
		logScan(i.log, s)
	}
	i.source, i.devices, i.missing, i.retry = s.source, next, s.missing, false
}

// isLost reports whether a Problem says the GPU is lost.
func isLost(problem string) bool { return strings.HasPrefix(problem, "lost") }

// Close releases NVML if this Inventory initialised it. It is safe to call
// more than once and concurrently with Run; after Close, Run no longer
// refreshes.
func (i *Inventory) Close() error {
	if i.backend == nil {
		return nil
	}
	return i.backend.close()
}
