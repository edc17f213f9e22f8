package local

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"sync"
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
	cpu0, cpuOK := cg.cpuUsageSince(reuseCPUReading)
	peak := cg.openPeak()
	meter, _ := p.b.cfg.GPUs.(energyMeter)
	e0, eOK := energyOf(meter, p.spec.GPUs)
	return func() backend.Usage {
		var u backend.Usage
		if cpu1, ok := cg.cpuUsageSince(0); ok && cpuOK {
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

// cgroupMeter keeps the cgroup files a call's measure reads open for the
// replica's life: opening them afresh for each call (path lookups in the
// cgroup filesystem, five system calls a file) cost more of inferd's CPU per
// call than anything else on a no-op model. cpu.stat is read again with
// pread at offset 0, which makes the kernel render it anew. memory.peak is
// reset for one descriptor at a time, so each call in flight takes its own
// from a free list and gives it back at its end.
type cgroupMeter struct {
	mu        sync.Mutex
	closed    bool     // the cgroup is gone: open nothing more
	cpuStat   *os.File // v2 cpu.stat; nil until the first read
	noCPU     bool     // cpu.stat could not be opened: do not retry each call
	idlePeaks []*os.File
	noReset   bool          // the kernel cannot reset memory.peak per descriptor (before 6.12)
	lastCPU   time.Duration // the latest cpu.stat reading
	lastAt    time.Time     // when it was taken; zero = none yet
	peak      *os.File      // the peak since the replica started, where there is no reset
	noPeak    bool          // that file could not be opened
}

// close closes every file the meter holds; a call still holding a peak
// descriptor closes it when it gives it back.
func (m *cgroupMeter) close() {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for _, f := range []*os.File{m.cpuStat, m.peak} {
		if f != nil {
			f.Close()
		}
	}
	for _, f := range m.idlePeaks {
		f.Close()
	}
	m.idlePeaks = nil
}

// cpuStatFile returns the replica's open cpu.stat, opening it on first use.
func (rc *replicaCgroup) cpuStatFile() *os.File {
	return rc.meter.held(&rc.meter.cpuStat, &rc.meter.noCPU, rc.v2, "cpu.stat")
}

// held returns *f, opening the file dir/name into it on first use; nil
// where it could not be opened (*failed, not tried again) or the cgroup is
// gone. (The path is joined only then: filepath.Join on every call showed
// in profiles.)
func (m *cgroupMeter) held(f **os.File, failed *bool, dir, name string) *os.File {
	m.mu.Lock()
	defer m.mu.Unlock()
	if *f == nil && !m.closed && !*failed {
		opened, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			*failed = true
			return nil
		}
		*f = opened
	}
	return *f
}

// reuseCPUReading is how old a cpu.stat reading a call's start may take
// instead of reading afresh. Calls one after the other on a replica then
// read it once each: the next call starts from the reading that ended the
// one before, so no CPU is charged twice, and a call's own CPU is never
// missed (its window only begins earlier, by at most this long). Reading
// cpu.stat makes the kernel gather the cgroup's per-CPU counters, the
// costliest part of measuring a call.
const reuseCPUReading = time.Millisecond

// cpuUsageSince returns the CPU time the cgroup's processes have used, from
// a reading at most maxAge old (0: read now); false without a v2 cgroup.
func (rc *replicaCgroup) cpuUsageSince(maxAge time.Duration) (time.Duration, bool) {
	if rc == nil || rc.v2 == "" {
		return 0, false
	}
	m := &rc.meter
	if maxAge > 0 {
		m.mu.Lock()
		cpu, at := m.lastCPU, m.lastAt
		m.mu.Unlock()
		if !at.IsZero() && time.Since(at) <= maxAge {
			return cpu, true
		}
	}
	at := time.Now()
	cpu, ok := rc.readCPUStat()
	if ok {
		m.mu.Lock()
		if at.After(m.lastAt) {
			m.lastCPU, m.lastAt = cpu, at
		}
		m.mu.Unlock()
	}
	return cpu, ok
}

// readCPUStat reads cpu.stat's usage_usec.
func (rc *replicaCgroup) readCPUStat() (time.Duration, bool) {
	f := rc.cpuStatFile()
	if f == nil {
		return 0, false
	}
	var buf [64]byte // usage_usec is its first line: the rest is not read
	n, err := f.ReadAt(buf[:], 0)
	if n == 0 && err != nil {
		return 0, false // closed under us: the replica is gone
	}
	us, ok := flatKeyed(buf[:n], "usage_usec")
	return time.Duration(us) * time.Microsecond, ok
}

// peakReader reads a cgroup's memory high-water mark at a call's end.
type peakReader struct {
	f *os.File     // the file to read; nil = nothing to read
	m *cgroupMeter // where f goes back to after the read; nil = f is shared
}

// openPeak starts watching the cgroup's memory peak for one call: on v2, a
// descriptor of memory.peak reset to now where the kernel allows it; else
// the peak since the replica started (v2's memory.peak, v1's
// memory.max_usage_in_bytes).
func (rc *replicaCgroup) openPeak() peakReader {
	if rc == nil {
		return peakReader{}
	}
	m := &rc.meter
	switch {
	case rc.v2 != "" && rc.cg.v2Ctl["memory"]:
		if f := m.takePeak(rc.v2); f != nil {
			return peakReader{f: f, m: m}
		}
		return peakReader{f: m.held(&m.peak, &m.noPeak, rc.v2, "memory.peak")}
	case rc.v1["memory"] != "":
		return peakReader{f: m.held(&m.peak, &m.noPeak, rc.v1["memory"], "memory.max_usage_in_bytes")}
	}
	return peakReader{}
}

// takePeak returns a memory.peak descriptor of v2 cgroup dir of its own for
// one call, reset to the usage now; nil where the kernel cannot reset one
// or the cgroup is gone.
func (m *cgroupMeter) takePeak(dir string) *os.File {
	m.mu.Lock()
	if m.closed || m.noReset {
		m.mu.Unlock()
		return nil
	}
	var f *os.File
	if n := len(m.idlePeaks); n > 0 {
		f, m.idlePeaks = m.idlePeaks[n-1], m.idlePeaks[:n-1]
	}
	m.mu.Unlock()
	if f == nil {
		var err error
		if f, err = os.OpenFile(filepath.Join(dir, "memory.peak"), os.O_RDWR, 0); err != nil {
			return nil
		}
	}
	if _, err := f.WriteAt([]byte("reset\n"), 0); err != nil {
		f.Close()
		m.mu.Lock()
		m.noReset = true
		m.mu.Unlock()
		return nil
	}
	return f
}

// givePeak takes back a descriptor from a call that has read it.
func (m *cgroupMeter) givePeak(f *os.File) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		f.Close()
		return
	}
	m.idlePeaks = append(m.idlePeaks, f)
}

// read returns the peak in bytes (0 when unknown) and releases the reader.
func (r peakReader) read() int64 {
	if r.f == nil {
		return 0
	}
	if r.m != nil {
		defer r.m.givePeak(r.f)
	}
	var buf [32]byte
	n, err := r.f.ReadAt(buf[:], 0)
	if n == 0 && err != nil {
		return 0
	}
	peak, err := strconv.ParseInt(string(bytes.TrimSpace(buf[:n])), 10, 64)
	if err != nil {
		return 0
	}
	return peak
}
