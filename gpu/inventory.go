package gpu

import (
	"context"
	"fmt"
	"slices"
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

// Inventory is the set of GPUs inferd may place replicas on. The set of
// devices is fixed when the Inventory is built; only the free memory and
// utilization of NVML devices change, through Run. All methods are safe for
// concurrent use.
type Inventory struct {
	source string
	log    zerolog.Logger

	// backend samples volatile device fields; nil for simulated and empty
	// inventories, whose devices never change.
	backend backend

	mu      sync.RWMutex
	devices []Device // sorted by Index; guarded by mu
}

// sample is the volatile part of a Device, as read by a refresh.
type sample struct {
	freeMiB uint64
	utilPct int
}

// backend is what an Inventory needs from a live GPU library.
type backend interface {
	// sample reads free memory and utilization, keyed by device UUID.
	// Devices that could not be read are absent (the backend logs them).
	sample() map[string]sample
	// close releases the library; later samples return nothing.
	close() error
}

func newInventory(source string, devs []Device, b backend, log zerolog.Logger) *Inventory {
	devs = slices.Clone(devs)
	if devs == nil {
		devs = []Device{} // Devices() marshals as [], not null
	}
	slices.SortFunc(devs, func(a, b Device) int { return a.Index - b.Index })
	return &Inventory{source: source, log: log, backend: b, devices: devs}
}

// empty is the Inventory of a box with no usable GPU.
func empty(log zerolog.Logger) *Inventory {
	return newInventory(sourceNone, nil, nil, log)
}

// Devices returns a copy of the devices, sorted by index; never nil.
// Callers may modify the returned slice.
func (i *Inventory) Devices() []Device {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return slices.Clone(i.devices)
}

// Count returns the number of devices.
func (i *Inventory) Count() int {
	i.mu.RLock()
	defer i.mu.RUnlock()
	return len(i.devices)
}

// Source says where the devices came from: "simulated", "none", or "nvml"
// followed by the driver version when NVML reported one, for example
// "nvml (driver 550.54.15)".
func (i *Inventory) Source() string {
	return i.source
}

// Run refreshes free memory and utilization every interval until ctx ends,
// then returns nil. For simulated and empty inventories there is nothing to
// refresh and Run just waits for ctx. Run one Run at a time per Inventory.
func (i *Inventory) Run(ctx context.Context, every time.Duration) error {
	if every <= 0 {
		return fmt.Errorf("gpu refresh interval must be positive, got %v", every)
	}
	if i.backend == nil {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			i.refresh()
		}
	}
}

// refresh applies one sample from the backend. Devices missing from the
// sample keep their last known values.
func (i *Inventory) refresh() {
	if i.backend == nil {
		return
	}
	s := i.backend.sample()
	i.mu.Lock()
	defer i.mu.Unlock()
	for k := range i.devices {
		d := &i.devices[k]
		if v, ok := s[d.UUID]; ok {
			d.MemoryFreeMiB = v.freeMiB
			d.UtilizationPct = v.utilPct
			d.Samples++
		}
	}
}

// Close releases NVML if this Inventory initialised it. It is safe to call
// more than once and concurrently with Run; after Close, Run no longer
// refreshes.
func (i *Inventory) Close() error {
	if i.backend == nil {
		return nil
	}
	return i.backend.close()
}
