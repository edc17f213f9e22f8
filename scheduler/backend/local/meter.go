package local

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"inferd/scheduler/backend"
)

// What a replica uses over one call, for the usage ledger
// (backend.Metered): its cgroup's CPU time (cgroup v2's cpu.stat, which
// every v2 cgroup has, controllers or not), its memory high-water mark
// (v2's memory.peak, reset for the call's own file descriptor where the
// kernel allows it, 6.12 and later; else the peak since the replica
// started; v1's memory.max_usage_in_bytes likewise), and its GPUs' energy
// counters (NVML, through the inventory). A measure the box cannot take
// is left unknown, never zero.

// energyMeter is an Inventory that reads GPU energy counters; *gpu.Inventory is one.
type energyMeter interface {
	EnergyMillijoules(uuid string) (uint64, bool)
}

// Measure implements backend.Metered.
func (p *Process) Measure() func() backend.Usage {
	var cg *replicaCgroup
	if p.box != nil {
		cg = p.box.cg
	}
	cpu0, cpuOK := cg.cpuUsage()
	peak := cg.openPeak()
	meter, _ := p.b.cfg.GPUs.(energyMeter)
	e0, eOK := energyOf(meter, p.spec.GPUs)
	return func() backend.Usage {
		var u backend.Usage
		if cpu1, ok := cg.cpuUsage(); ok && cpuOK {
			u.CPU, u.CPUKnown = max(cpu1-cpu0, 0), true
		}
		u.PeakMemoryBytes = peak.read()
		if e1, ok := energyOf(meter, p.spec.GPUs); ok && eOK && e1 >= e0 {
			j := float64(e1-e0) / 1000
			u.EnergyJoules = &j
		}
		return u
	}
}

// energyOf sums the energy counters of gpus, in millijoules; false when
// there are none, or one has no counter.
func energyOf(m energyMeter, gpus []string) (uint64, bool) {
	if m == nil || len(gpus) == 0 {
		return 0, false
	}
	var sum uint64
	for _, id := range gpus {
		mj, ok := m.EnergyMillijoules(id)
		if !ok {
			return 0, false
		}
		sum += mj
	}
	return sum, true
}

// cpuUsage reads the CPU time the cgroup's processes have used; false
// without a v2 cgroup.
func (rc *replicaCgroup) cpuUsage() (time.Duration, bool) {
	if rc == nil || rc.v2 == "" {
		return 0, false
	}
	data, err := os.ReadFile(filepath.Join(rc.v2, "cpu.stat"))
	if err != nil {
		return 0, false
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Duration(us) * time.Microsecond, err == nil
		}
	}
	return 0, false
}

// peakReader reads a cgroup's memory high-water mark at a call's end.
type peakReader struct {
	f    *os.File // v2 memory.peak, reset for this descriptor; nil: read path
	path string   // the file to read afresh; "" = nothing to read
}

// openPeak starts watching the cgroup's memory peak for one call: on v2, a
// descriptor of memory.peak reset to now where the kernel allows it.
func (rc *replicaCgroup) openPeak() peakReader {
	switch {
	case rc == nil:
		return peakReader{}
	case rc.v2 != "" && rc.cg.v2Ctl["memory"]:
		path := filepath.Join(rc.v2, "memory.peak")
		if f, err := os.OpenFile(path, os.O_RDWR, 0); err == nil {
			if _, err := f.WriteString("reset\n"); err == nil {
				return peakReader{f: f}
			}
			f.Close() // a kernel before 6.12: the peak since the replica started
		}
		return peakReader{path: path}
	case rc.v1["memory"] != "":
		return peakReader{path: filepath.Join(rc.v1["memory"], "memory.max_usage_in_bytes")}
	}
	return peakReader{}
}

// read returns the peak in bytes (0 when unknown) and releases the reader.
func (r peakReader) read() int64 {
	var data []byte
	switch {
	case r.f != nil:
		defer r.f.Close()
		buf := make([]byte, 32)
		n, err := r.f.ReadAt(buf, 0)
		if n == 0 && err != nil {
			return 0
		}
		data = buf[:n]
	case r.path != "":
		var err error
		if data, err = os.ReadFile(r.path); err != nil {
			return 0
		}
	default:
		return 0
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0
	}
	return n
}
