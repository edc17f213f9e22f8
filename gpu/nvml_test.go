//go:build cgo

package gpu

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock"
	"github.com/rs/zerolog"
)

const mib = 1 << 20

// fakeGPU is the state behind one mock.Device: a GPU, or a MIG device
// (then in its parent's migs). Its fields may be changed while a refresh
// runs, so every read and write holds mu.
type fakeGPU struct {
	mu          sync.Mutex
	index       int
	minor       int // the device minor number; h100's differs from its index
	minorRet    nvml.Return
	uuid        string
	name        string
	totalMiB    uint64
	reservedMiB uint64 // shown by GetMemoryInfo_v2 only; v1 counts it as used
	freeMiB     uint64
	util        uint32
	utilRet     nvml.Return
	migMode     int
	migRet      nvml.Return
	memRet      nvml.Return // both GetMemoryInfo versions
	uuidRet     nvml.Return
	handleRet   nvml.Return // returned by DeviceGetHandleByIndex for this GPU
	procs       []nvml.ProcessInfo
	procRet     nvml.Return
	migs        []*fakeGPU // MIG devices by MIG slot; nil entries are empty slots
	gi, ci      int        // a MIG device's GPU and compute instance ids
	giRet       nvml.Return
	memCalls    int         // GetMemoryInfo (either version) calls so far
	energyMJ    uint64      // the total-energy counter
	energyRet   nvml.Return // NOT_SUPPORTED: no counter (MIG devices, older GPUs)
}

func (f *fakeGPU) set(change func(f *fakeGPU)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

// device returns a mock.Device with every method discovery and refresh
// call; any other method panics (the mock's default), failing the test.
func (f *fakeGPU) device() *mock.Device {
	lock := func() func() { f.mu.Lock(); return f.mu.Unlock }
	return &mock.Device{
		GetIndexFunc:             func() (int, nvml.Return) { defer lock()(); return f.index, nvml.SUCCESS },
		GetUUIDFunc:              func() (string, nvml.Return) { defer lock()(); return f.uuid, f.uuidRet },
		GetNameFunc:              func() (string, nvml.Return) { defer lock()(); return f.name, nvml.SUCCESS },
		GetMinorNumberFunc:       func() (int, nvml.Return) { defer lock()(); return f.minor, f.minorRet },
		GetGpuInstanceIdFunc:     func() (int, nvml.Return) { defer lock()(); return f.gi, f.giRet },
		GetComputeInstanceIdFunc: func() (int, nvml.Return) { defer lock()(); return f.ci, nvml.SUCCESS },
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			defer lock()()
			f.memCalls++
			return nvml.Memory{Total: f.totalMiB * mib, Free: f.freeMiB * mib, Used: (f.totalMiB - f.freeMiB) * mib}, f.memRet
		},
		GetMemoryInfo_v2Func: func() (nvml.Memory_v2, nvml.Return) {
			defer lock()()
			f.memCalls++
			return nvml.Memory_v2{
				Total: f.totalMiB * mib, Reserved: f.reservedMiB * mib, Free: f.freeMiB * mib,
				Used: (f.totalMiB - f.reservedMiB - f.freeMiB) * mib,
			}, f.memRet
		},
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			defer lock()()
			return nvml.Utilization{Gpu: f.util, Memory: f.util / 2}, f.utilRet
		},
		GetMigModeFunc: func() (int, int, nvml.Return) { defer lock()(); return f.migMode, f.migMode, f.migRet },
		GetComputeRunningProcessesFunc: func() ([]nvml.ProcessInfo, nvml.Return) {
			defer lock()()
			return slices.Clone(f.procs), f.procRet
		},
		GetMaxMigDeviceCountFunc: func() (int, nvml.Return) { defer lock()(); return len(f.migs), nvml.SUCCESS },
		GetTotalEnergyConsumptionFunc: func() (uint64, nvml.Return) {
			defer lock()()
			return f.energyMJ, f.energyRet
		},
		GetMigDeviceHandleByIndexFunc: func(k int) (nvml.Device, nvml.Return) {
			defer lock()()
			if k < 0 || k >= len(f.migs) || f.migs[k] == nil {
				return nil, nvml.ERROR_NOT_FOUND
			}
			return f.migs[k].device(), nvml.SUCCESS
		},
	}
}

// migMinors writes a driver MIG capability map for h100 (GPU minor 3) with
// GPU instances 1 and 2, one compute instance each, and returns its path.
func migMinors(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "mig-minors")
	data := "config 1\nmonitor 2\ngpu0/gi1/access 3\ngpu0/gi1/ci0/access 4\n" +
		"gpu3/gi1/access 12\ngpu3/gi1/ci0/access 13\ngpu3/gi2/access 21\ngpu3/gi2/ci0/access 22\n"
	if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// a100 and h100 return healthy fake GPUs; tests change what they need.
func a100() *fakeGPU {
	return &fakeGPU{index: 0, uuid: "GPU-aaaaaaaa-0000-0000-0000-000000000000", name: "NVIDIA A100-SXM4-40GB",
		totalMiB: 40960, reservedMiB: 400, freeMiB: 30000, util: 12, migMode: nvml.DEVICE_MIG_DISABLE}
}

func h100() *fakeGPU {
	return &fakeGPU{index: 1, minor: 3, uuid: "GPU-bbbbbbbb-0000-0000-0000-000000000000", name: "NVIDIA H100 80GB HBM3",
		totalMiB: 81559, reservedMiB: 600, freeMiB: 81000, util: 55, migMode: nvml.DEVICE_MIG_DISABLE}
}

// migSlice returns a MIG device of the given size.
func migSlice(uuid, profile string, totalMiB uint64, gi int) *fakeGPU {
	return &fakeGPU{uuid: uuid, gi: gi, name: "NVIDIA H100 80GB HBM3 MIG " + profile, totalMiB: totalMiB, freeMiB: totalMiB,
		utilRet: nvml.ERROR_NOT_SUPPORTED}
}

// fakeNVML is the library behind a mock.Interface: the GPUs it enumerates,
// what Init answers, and whether the driver has GetMemoryInfo_v2.
type fakeNVML struct {
	mu       sync.Mutex
	gpus     []*fakeGPU
	initRets []nvml.Return // answered by successive Inits; SUCCESS once used up
	v2       bool
}

func (n *fakeNVML) set(change func(n *fakeNVML)) {
	n.mu.Lock()
	defer n.mu.Unlock()
	change(n)
}

// newMockLib returns a mock NVML whose Init succeeds, that enumerates gpus
// in order, and whose driver lacks GetMemoryInfo_v2 (a call to it would
// panic: GetMemoryInfo_v2Func is set, but the test fails on the reading).
func newMockLib(driver string, gpus ...*fakeGPU) *mock.Interface {
	return (&fakeNVML{gpus: gpus}).lib(driver)
}

func (n *fakeNVML) lib(driver string) *mock.Interface {
	lock := func() func() { n.mu.Lock(); return n.mu.Unlock }
	return &mock.Interface{
		InitFunc: func() nvml.Return {
			defer lock()()
			if len(n.initRets) == 0 {
				return nvml.SUCCESS
			}
			ret := n.initRets[0]
			n.initRets = n.initRets[1:]
			return ret
		},
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			if driver == "" {
				return "", nvml.ERROR_UNKNOWN
			}
			return driver, nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { defer lock()(); return len(n.gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(k int) (nvml.Device, nvml.Return) {
			defer lock()()
			if k < 0 || k >= len(n.gpus) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			g := n.gpus[k]
			g.mu.Lock()
			defer g.mu.Unlock()
			if g.handleRet != nvml.SUCCESS {
				return nil, g.handleRet
			}
			return g.device(), nvml.SUCCESS
		},
		ExtensionsFunc: func() nvml.ExtendedInterface {
			return &mock.ExtendedInterface{LookupSymbolFunc: func(name string) error {
				defer lock()()
				if name == memInfoV2Symbol && n.v2 {
					return nil
				}
				return fmt.Errorf("undefined symbol %s", name)
			}}
		},
	}
}

func warnings(lines []logLine) []logLine {
	var out []logLine
	for _, l := range lines {
		if l.level() == "warn" {
			out = append(out, l)
		}
	}
	return out
}

const (
	uuidA = "GPU-aaaaaaaa-0000-0000-0000-000000000000"
	uuidH = "GPU-bbbbbbbb-0000-0000-0000-000000000000"
	nameA = "NVIDIA A100-SXM4-40GB"
	nameH = "NVIDIA H100 80GB HBM3"
)

// discoveredA and discoveredH are a100() and h100() as discovery lists them
// from a driver without GetMemoryInfo_v2.
var (
	discoveredA = Device{Index: 0, UUID: uuidA, Name: nameA, MemoryTotalMiB: 40960, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1}
	discoveredH = Device{Index: 1, UUID: uuidH, Name: nameH, Minor: 3, MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, UtilizationPct: 55, Samples: 1}
)

func TestDiscoverMapsNVMLDevices(t *testing.T) {
	tests := []struct {
		name       string
		driver     string
		v2         bool // the driver has GetMemoryInfo_v2
		gpus       func() []*fakeGPU
		wantSource string
		want       []Device
		// wantWarns holds, per expected warning line, substrings of that
		// line's fields ("uuid"/"index"/"error" values and message).
		wantWarns [][]string
	}{
		{
			name:       "two GPUs on a driver without GetMemoryInfo_v2: reserved unknown",
			driver:     "470.256.02",
			gpus:       func() []*fakeGPU { return []*fakeGPU{a100(), h100()} },
			wantSource: "nvml (driver 470.256.02)",
			want: []Device{
				discoveredA,
				discoveredH,
			},
		},
		{
			name:       "GetMemoryInfo_v2 where the symbol exists: driver-reserved memory split out",
			driver:     "550.54.15",
			v2:         true,
			gpus:       func() []*fakeGPU { return []*fakeGPU{a100()} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 0, UUID: uuidA, Name: nameA, MemoryTotalMiB: 40960, DriverReservedMiB: 400, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1},
			},
		},
		{
			name:   "compute processes and the memory each uses",
			driver: "550.54.15",
			gpus: func() []*fakeGPU {
				a := a100()
				a.procs = []nvml.ProcessInfo{{Pid: 4242, UsedGpuMemory: 9000 * mib}, {Pid: 77, UsedGpuMemory: ^uint64(0)}}
				return []*fakeGPU{a}
			},
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 0, UUID: uuidA, Name: nameA, MemoryTotalMiB: 40960, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1,
					Processes: []Process{{Pid: 4242, UsedMiB: 9000}, {Pid: 77, UsedMiB: 0}}},
			},
		},
		{
			name:   "a GPU in MIG mode is listed as its MIG devices, empty slots skipped",
			driver: "550.54.15",
			v2:     true,
			gpus: func() []*fakeGPU {
				h := h100()
				h.migMode, h.utilRet = nvml.DEVICE_MIG_ENABLE, nvml.ERROR_NOT_SUPPORTED
				h.migs = []*fakeGPU{migSlice("MIG-11111111-0000-0000-0000-000000000000", "3g.40gb", 40192, 1), nil,
					migSlice("MIG-22222222-0000-0000-0000-000000000000", "1g.10gb", 9856, 2)}
				return []*fakeGPU{a100(), h}
			},
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 0, UUID: uuidA, Name: nameA, MemoryTotalMiB: 40960, DriverReservedMiB: 400, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1},
				{Index: 1, UUID: "MIG-11111111-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb", Minor: 3, CapMinors: []int{12, 13}, MemoryTotalMiB: 40192, MemoryFreeMiB: 40192, MIG: true, Parent: uuidH, Samples: 1},
				{Index: 1, UUID: "MIG-22222222-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3 MIG 1g.10gb", Minor: 3, CapMinors: []int{21, 22}, MemoryTotalMiB: 9856, MemoryFreeMiB: 9856, MIG: true, Parent: uuidH, Samples: 1},
			},
		},
		{
			name:   "a MIG device missing from the driver's capability map has no capability minors, and says so",
			driver: "550.54.15",
			gpus: func() []*fakeGPU {
				h := h100()
				h.migMode, h.utilRet = nvml.DEVICE_MIG_ENABLE, nvml.ERROR_NOT_SUPPORTED
				h.migs = []*fakeGPU{migSlice("MIG-11111111-0000-0000-0000-000000000000", "3g.40gb", 40192, 7)}
				return []*fakeGPU{h}
			},
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 1, UUID: "MIG-11111111-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3 MIG 3g.40gb", Minor: 3, MemoryTotalMiB: 40192, MemoryFreeMiB: 40192, MIG: true, Parent: uuidH, Samples: 1},
			},
			wantWarns: [][]string{{"not in the capability map", "MIG-11111111"}},
		},
		{
			name:   "a GPU in MIG mode without MIG devices gives no unit and says why",
			driver: "550.54.15",
			gpus: func() []*fakeGPU {
				h := h100()
				h.migMode = nvml.DEVICE_MIG_ENABLE
				return []*fakeGPU{h}
			},
			wantSource: "nvml (driver 550.54.15)",
			want:       []Device{},
			wantWarns:  [][]string{{"MIG mode but has no MIG devices", uuidH, "nvidia-smi mig"}},
		},
		{
			name:   "MIG not supported reads as off",
			driver: "470.256.02",
			gpus: func() []*fakeGPU {
				g := a100()
				g.migRet, g.migMode = nvml.ERROR_NOT_SUPPORTED, 0
				return []*fakeGPU{g}
			},
			wantSource: "nvml (driver 470.256.02)",
			want: []Device{
				discoveredA,
			},
		},
		{
			name:       "a failing MIG mode query is not fatal: the GPU is used whole",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { g := a100(); g.migRet = nvml.ERROR_UNKNOWN; return []*fakeGPU{g} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				discoveredA,
			},
			wantWarns: [][]string{{"MIG mode query failed", uuidA, "ERROR_UNKNOWN"}},
		},
		{
			name:       "a failing utilization query is not fatal",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { g := h100(); g.utilRet = nvml.ERROR_TIMEOUT; return []*fakeGPU{g} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 1, UUID: uuidH, Name: nameH, Minor: 3, MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, Samples: 1},
			},
			wantWarns: [][]string{{"GPU query failed", uuidH, "utilization", "ERROR_TIMEOUT"}},
		},
		{
			name:       "a GPU without a minor number (no device node to allow) is skipped",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { g := h100(); g.minorRet = nvml.ERROR_UNKNOWN; return []*fakeGPU{a100(), g} },
			wantSource: "nvml (driver 550.54.15)",
			want:       []Device{discoveredA},
			wantWarns:  [][]string{{"skipping GPU: query failed", uuidH, "minor number"}},
		},
		{
			name:       "devices are sorted by NVML index",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { a, h := a100(), h100(); a.index, h.index = 1, 0; return []*fakeGPU{a, h} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 0, UUID: uuidH, Name: nameH, Minor: 3, MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, UtilizationPct: 55, Samples: 1},
				{Index: 1, UUID: uuidA, Name: nameA, MemoryTotalMiB: 40960, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1},
			},
		},
		{
			name:       "a device whose memory read fails is listed unhealthy",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { g := h100(); g.memRet = nvml.ERROR_UNKNOWN; return []*fakeGPU{a100(), g} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				discoveredA,
				{Index: 1, UUID: uuidH, Name: nameH, Minor: 3, Problem: "memory read failed (ERROR_UNKNOWN)"},
			},
			wantWarns: [][]string{{"GPU unhealthy", uuidH, "ERROR_UNKNOWN"}},
		},
		{
			name:       "a lost GPU's handle fails: the other is listed",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { g := a100(); g.handleRet = nvml.ERROR_GPU_IS_LOST; return []*fakeGPU{g, h100()} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				discoveredH,
			},
			wantWarns: [][]string{{"skipping GPU", "index=0", "ERROR_GPU_IS_LOST"}},
		},
		{
			name:       "a device without a UUID is left out",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { a := a100(); a.uuidRet = nvml.ERROR_UNKNOWN; return []*fakeGPU{a} },
			wantSource: "nvml (driver 550.54.15)",
			want:       []Device{},
			wantWarns:  [][]string{{"skipping GPU", "index=0", "get UUID"}},
		},
		{
			name:       "no devices and no driver version",
			gpus:       func() []*fakeGPU { return nil },
			wantSource: "nvml",
			want:       []Device{},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, lines := newTestLogger(t)
			lib := (&fakeNVML{gpus: tc.gpus(), v2: tc.v2}).lib(tc.driver)
			inv := discover(lib, migMinors(t), log)

			if got := inv.Source(); got != tc.wantSource {
				t.Errorf("Source() = %q, want %q", got, tc.wantSource)
			}
			if got := inv.Devices(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Devices() =\n  %+v\nwant\n  %+v", got, tc.want)
			}
			if got := inv.Count(); got != len(tc.want) {
				t.Errorf("Count() = %d, want %d", got, len(tc.want))
			}
			checkWarnings(t, warnings(lines()), tc.wantWarns)

			if err := inv.Close(); err != nil {
				t.Errorf("Close() = %v", err)
			}
			if err := inv.Close(); err != nil {
				t.Errorf("second Close() = %v", err)
			}
			if n := len(lib.ShutdownCalls()); n != 1 {
				t.Errorf("Shutdown called %d times, want 1", n)
			}
		})
	}
}

// checkWarnings compares warning lines with per-line substrings.
func checkWarnings(t *testing.T, warns []logLine, want [][]string) {
	t.Helper()
	if len(warns) != len(want) {
		t.Fatalf("got %d warnings, want %d: %v", len(warns), len(want), warns)
	}
	for k, subs := range want {
		text := flatten(warns[k])
		for _, s := range subs {
			if !strings.Contains(text, s) {
				t.Errorf("warning %d = %q, want it to contain %q", k, text, s)
			}
		}
	}
}

// flatten renders a log line as sorted "key=value" pairs for substring
// checks.
func flatten(l logLine) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(l)) {
		fmt.Fprintf(&b, "%s=%v ", k, l[k])
	}
	return b.String()
}

// offLimits returns a mock NVML whose Init answers ret and whose every
// other method fails the test: after a failed Init the real library kills
// the process on any other call. nvmlLib has exactly these methods besides
// Init (devices are reachable only through DeviceGetHandleByIndex); every
// other mock method panics.
func offLimits(t *testing.T, ret func() nvml.Return) *mock.Interface {
	var up bool
	var mu sync.Mutex
	called := func(name string) {
		mu.Lock()
		defer mu.Unlock()
		if !up {
			t.Errorf("%s called while Init has not succeeded", name)
		}
	}
	return &mock.Interface{
		InitFunc: func() nvml.Return {
			r := ret()
			mu.Lock()
			up = r == nvml.SUCCESS
			mu.Unlock()
			return r
		},
		ShutdownFunc: func() nvml.Return { called("Shutdown"); return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			called("SystemGetDriverVersion")
			return "550.54.15", nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { called("DeviceGetCount"); return 1, nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) {
			called("DeviceGetHandleByIndex")
			return a100().device(), nvml.SUCCESS
		},
		ExtensionsFunc: func() nvml.ExtendedInterface {
			called("Extensions")
			return &mock.ExtendedInterface{LookupSymbolFunc: func(string) error { return errors.New("none") }}
		},
	}
}

func TestDiscoverInitFailureCallsNothingElse(t *testing.T) {
	tests := []struct {
		name      string
		ret       nvml.Return
		wantLevel string
		wantMsg   string
	}{
		{name: "library not found", ret: nvml.ERROR_LIBRARY_NOT_FOUND, wantLevel: "info", wantMsg: "no NVIDIA driver found: running on CPU only"},
		{name: "driver not loaded", ret: nvml.ERROR_DRIVER_NOT_LOADED, wantLevel: "info", wantMsg: "no NVIDIA driver found: running on CPU only"},
		{name: "no permission", ret: nvml.ERROR_NO_PERMISSION, wantLevel: "warn", wantMsg: "NVML init failed: running on CPU only"},
		{name: "driver/library mismatch", ret: nvml.ERROR_LIB_RM_VERSION_MISMATCH, wantLevel: "warn", wantMsg: "NVML init failed: running on CPU only"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, lines := newTestLogger(t)
			lib := offLimits(t, func() nvml.Return { return tc.ret })

			inv := discover(lib, migMinors(t), log)
			// The whole life of the inventory must stay off NVML too.
			inv.refresh()
			inv.RefreshSoon()
			ctx, cancel := context.WithCancel(t.Context())
			cancel()
			if err := inv.Run(ctx, time.Second); err != nil {
				t.Errorf("Run() = %v", err)
			}
			if err := inv.Close(); err != nil {
				t.Errorf("Close() = %v", err)
			}

			if n := len(lib.InitCalls()); n != 1 {
				t.Errorf("Init called %d times, want 1", n)
			}
			if got := inv.Source(); got != "none" {
				t.Errorf("Source() = %q, want none", got)
			}
			if got := inv.Devices(); got == nil || len(got) != 0 || inv.Count() != 0 {
				t.Errorf("Devices() = %#v, Count() = %d, want empty", got, inv.Count())
			}
			got := lines()
			if len(got) != 1 {
				t.Fatalf("got %d log lines, want exactly 1: %v", len(got), got)
			}
			if got[0].level() != tc.wantLevel || got[0].message() != tc.wantMsg {
				t.Errorf("log = %v, want %s %q", got[0], tc.wantLevel, tc.wantMsg)
			}
			if !strings.Contains(flatten(got[0]), tc.ret.Error()) {
				t.Errorf("log = %v, want it to name %v", got[0], tc.ret)
			}
		})
	}
}

// TestInitIsRetriedWithBackoffUntilTheDriverLoads: inferd started before
// the driver finds the GPUs once it loads, calling nothing but Init before.
func TestInitIsRetriedWithBackoffUntilTheDriverLoads(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		start := time.Now()
		var mu sync.Mutex
		var inits []time.Duration // when Init was called, since start
		rets := []nvml.Return{nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_LIBRARY_NOT_FOUND, nvml.ERROR_DRIVER_NOT_LOADED, nvml.ERROR_DRIVER_NOT_LOADED}
		lib := offLimits(t, func() nvml.Return {
			mu.Lock()
			defer mu.Unlock()
			inits = append(inits, time.Since(start))
			if len(rets) == 0 {
				return nvml.SUCCESS
			}
			r := rets[0]
			rets = rets[1:]
			return r
		})
		log, lines := newTestLogger(t)
		inv := discover(lib, migMinors(t), log)
		defer inv.Close()
		stop := running(t, inv, time.Hour)

		time.Sleep(6 * time.Second) // Inits at 1s, 3s (1+2) fail
		synctest.Wait()
		if inv.Count() != 0 || inv.Source() != "none" {
			t.Fatalf("after 6s: %d GPUs from %q, want none yet", inv.Count(), inv.Source())
		}
		time.Sleep(10 * time.Second) // 7s fails, 15s succeeds
		synctest.Wait()
		if got := inv.Source(); got != "nvml (driver 550.54.15)" {
			t.Errorf("Source() = %q once the driver is up", got)
		}
		if devs := inv.Devices(); len(devs) != 1 || devs[0].UUID != uuidA || !devs[0].Healthy() {
			t.Errorf("Devices() = %+v, want the A100, healthy", devs)
		}
		mu.Lock()
		want := []time.Duration{0, time.Second, 3 * time.Second, 7 * time.Second, 15 * time.Second}
		if !slices.Equal(inits, want) {
			t.Errorf("Init called at %v, want %v (discovery, then backoff 1s doubling)", inits, want)
		}
		mu.Unlock()
		if !slices.ContainsFunc(lines(), func(l logLine) bool { return l.message() == "NVML GPU discovery done" }) {
			t.Errorf("no discovery line once the driver is up: %v", lines())
		}

		time.Sleep(10 * time.Minute) // healthy: no more rediscovery
		synctest.Wait()
		if n := len(lib.InitCalls()); n != 5 {
			t.Errorf("Init called %d times in all, want 5", n)
		}
		if err := stop(); err != nil {
			t.Errorf("Run() = %v", err)
		}
	})
}

// running runs inv.Run in the background; stop ends it and returns its
// error.
func running(t *testing.T, inv *Inventory, every time.Duration) (stop func() error) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- inv.Run(ctx, every) }()
	return func() error { cancel(); return <-done }
}

func TestDiscoverDeviceCountFailureShutsDown(t *testing.T) {
	log, lines := newTestLogger(t)
	lib := newMockLib("550.54.15", a100())
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }

	inv := discover(lib, migMinors(t), log)
	if inv.Count() != 0 || inv.Source() != "none" {
		t.Errorf("Count() = %d, Source() = %q, want 0, none", inv.Count(), inv.Source())
	}
	if err := inv.Close(); err != nil {
		t.Errorf("Close() = %v", err)
	}
	if n := len(lib.ShutdownCalls()); n != 1 {
		t.Errorf("Shutdown called %d times, want 1", n)
	}
	if w := warnings(lines()); len(w) != 1 {
		t.Errorf("got %d warnings, want 1: %v", len(w), w)
	}
}

func TestRefreshUpdatesVolatileFields(t *testing.T) {
	type step struct {
		change      func(a, h *fakeGPU)
		wantFree    [2]uint64
		wantUtil    [2]int
		wantProblem [2]string
		wantWarns   int // warning lines logged during this step
		// wantSamples: successful reads per GPU so far, discovery included.
		wantSamples [2]uint64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "free memory, utilization and processes follow NVML",
			steps: []step{
				{
					change:   func(a, h *fakeGPU) { a.freeMiB, a.util = 1000, 97; h.freeMiB = 80000 },
					wantFree: [2]uint64{1000, 80000}, wantUtil: [2]int{97, 55}, wantSamples: [2]uint64{2, 2},
				},
				{
					change:   func(a, h *fakeGPU) { a.freeMiB, a.util = 40000, 0 },
					wantFree: [2]uint64{40000, 80000}, wantUtil: [2]int{0, 55}, wantSamples: [2]uint64{3, 3},
				},
			},
		},
		{
			name: "a lost GPU is unhealthy and keeps its last values until it reads again",
			steps: []step{
				{
					change:   func(a, h *fakeGPU) { a.memRet = nvml.ERROR_GPU_IS_LOST; a.freeMiB = 1; h.freeMiB = 70000 },
					wantFree: [2]uint64{30000, 70000}, wantUtil: [2]int{12, 55}, wantWarns: 1, wantSamples: [2]uint64{1, 2},
					wantProblem: [2]string{"lost (ERROR_GPU_IS_LOST)", ""},
				},
				{
					change:   func(a, h *fakeGPU) { h.freeMiB = 60000 },
					wantFree: [2]uint64{30000, 60000}, wantUtil: [2]int{12, 55}, wantWarns: 0, wantSamples: [2]uint64{1, 3},
					wantProblem: [2]string{"lost (ERROR_GPU_IS_LOST)", ""},
				},
				{
					change:   func(a, h *fakeGPU) { a.memRet = nvml.SUCCESS },
					wantFree: [2]uint64{1, 60000}, wantUtil: [2]int{12, 55}, wantWarns: 0, wantSamples: [2]uint64{2, 4},
				},
			},
		},
		{
			name: "a process list answering GPU_IS_LOST makes the GPU lost",
			steps: []step{
				{
					change:   func(a, h *fakeGPU) { a.procRet = nvml.ERROR_GPU_IS_LOST; a.freeMiB = 5 },
					wantFree: [2]uint64{30000, 81000}, wantUtil: [2]int{12, 55}, wantWarns: 2, wantSamples: [2]uint64{1, 2},
					wantProblem: [2]string{"lost (ERROR_GPU_IS_LOST)", ""},
				},
			},
		},
		{
			name: "a failing utilization keeps its last value but not the memory reading",
			steps: []step{
				{
					change:   func(a, h *fakeGPU) { a.utilRet = nvml.ERROR_UNKNOWN; a.freeMiB, a.util = 2, 80 },
					wantFree: [2]uint64{2, 81000}, wantUtil: [2]int{12, 55}, wantWarns: 1, wantSamples: [2]uint64{2, 2},
				},
				{
					change:   func(a, h *fakeGPU) { a.freeMiB = 3 },
					wantFree: [2]uint64{3, 81000}, wantUtil: [2]int{12, 55}, wantWarns: 0, wantSamples: [2]uint64{3, 3},
				},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, lines := newTestLogger(t)
			a, h := a100(), h100()
			inv := discover(newMockLib("550.54.15", a, h), migMinors(t), log)
			t.Cleanup(func() { inv.Close() })
			warned := len(warnings(lines()))
			for k, s := range tc.steps {
				func() {
					a.mu.Lock()
					h.mu.Lock()
					defer a.mu.Unlock()
					defer h.mu.Unlock()
					s.change(a, h)
				}()
				inv.refresh()
				devs := inv.Devices()
				for d := range 2 {
					if devs[d].MemoryFreeMiB != s.wantFree[d] || devs[d].UtilizationPct != s.wantUtil[d] {
						t.Errorf("step %d GPU %d: free %d util %d, want free %d util %d",
							k, d, devs[d].MemoryFreeMiB, devs[d].UtilizationPct, s.wantFree[d], s.wantUtil[d])
					}
					if devs[d].Samples != s.wantSamples[d] {
						t.Errorf("step %d GPU %d: %d samples, want %d", k, d, devs[d].Samples, s.wantSamples[d])
					}
					if devs[d].Problem != s.wantProblem[d] {
						t.Errorf("step %d GPU %d: problem %q, want %q", k, d, devs[d].Problem, s.wantProblem[d])
					}
					if devs[d].MemoryTotalMiB == 0 || devs[d].Name == "" {
						t.Errorf("step %d GPU %d: static fields lost: %+v", k, d, devs[d])
					}
				}
				now := len(warnings(lines()))
				if now-warned != s.wantWarns {
					t.Errorf("step %d: %d new warnings, want %d: %v", k, now-warned, s.wantWarns, lines())
				}
				warned = now
			}
		})
	}
}

// TestLostGPUIsRediscoveredWithBackoff: a lost GPU stays out (unhealthy)
// while NVML, started afresh with backoff, still cannot read it, and is
// healthy again once it can, its read count still growing.
func TestLostGPUIsRediscoveredWithBackoff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a, h := a100(), h100()
		lib := newMockLib("550.54.15", a, h)
		log, lines := newTestLogger(t)
		inv := discover(lib, migMinors(t), log)
		defer inv.Close()
		stop := running(t, inv, time.Hour)

		a.set(func(f *fakeGPU) { f.memRet = nvml.ERROR_GPU_IS_LOST })
		inv.RefreshSoon()
		synctest.Wait()
		if d := inv.Devices()[0]; d.Healthy() {
			t.Fatalf("A100 healthy after NVML said it is lost: %+v", d)
		}
		time.Sleep(4 * time.Second) // restarts at 1s and 3s: still lost
		synctest.Wait()
		if n := len(lib.InitCalls()); n != 3 {
			t.Errorf("Init called %d times after 4s, want 3 (discovery, 1s, 3s)", n)
		}
		if d := inv.Devices()[0]; d.Healthy() || d.UUID != uuidA {
			t.Errorf("A100 = %+v, want it still listed, unhealthy", d)
		}
		if d := inv.Devices()[1]; !d.Healthy() || d.Samples < 2 {
			t.Errorf("H100 = %+v, want healthy and read again by the restarts", d)
		}
		// One line when the refresh found it lost, one when a restart did:
		// the restarts that follow say nothing new.
		if w := warnings(lines()); len(w) != 2 {
			t.Errorf("warnings after two restarts: %v, want 2", w)
		}
		samples := inv.Devices()[0].Samples

		a.set(func(f *fakeGPU) { f.memRet, f.freeMiB = nvml.SUCCESS, 39000 })
		time.Sleep(4 * time.Second) // restart at 7s
		synctest.Wait()
		d := inv.Devices()[0]
		if !d.Healthy() || d.MemoryFreeMiB != 39000 || d.Samples <= samples {
			t.Errorf("A100 after it reads again = %+v, want healthy, free 39000, samples above %d", d, samples)
		}
		if !slices.ContainsFunc(lines(), func(l logLine) bool { return l.message() == "GPU healthy again" }) {
			t.Errorf("no recovery line: %v", lines())
		}
		stop()
	})
}

// TestRediscoveryFollowsTheDeviceSet: MIG devices that disappear are
// dropped and new ones added; a GPU NVML no longer lists stays, lost.
func TestRediscoveryFollowsTheDeviceSet(t *testing.T) {
	a, h := a100(), h100()
	h.migMode, h.utilRet = nvml.DEVICE_MIG_ENABLE, nvml.ERROR_NOT_SUPPORTED
	h.migs = []*fakeGPU{migSlice("MIG-11111111-0000-0000-0000-000000000000", "3g.40gb", 40192, 1)}
	n := &fakeNVML{gpus: []*fakeGPU{a, h}}
	inv := discover(n.lib("550.54.15"), migMinors(t), zerolog.Nop())
	defer inv.Close()

	h.set(func(f *fakeGPU) {
		f.migs = []*fakeGPU{nil, migSlice("MIG-33333333-0000-0000-0000-000000000000", "1g.10gb", 9856, 2)}
	})
	n.set(func(n *fakeNVML) { n.gpus = []*fakeGPU{h} }) // the A100 fell off the bus
	a.set(func(f *fakeGPU) { f.memRet = nvml.ERROR_GPU_IS_LOST })
	inv.refresh()
	inv.rediscover()

	got := inv.Devices()
	var ids []string
	for _, d := range got {
		ids = append(ids, fmt.Sprintf("%s healthy=%v", d.UUID, d.Healthy()))
	}
	want := []string{uuidA + " healthy=false", "MIG-33333333-0000-0000-0000-000000000000 healthy=true"}
	if !slices.Equal(ids, want) {
		t.Errorf("devices after rediscovery = %v, want %v", ids, want)
	}
	if !isLost(got[0].Problem) {
		t.Errorf("A100 problem = %q, want lost", got[0].Problem)
	}
}

func TestRefreshAfterCloseQueriesNothing(t *testing.T) {
	a := a100()
	lib := newMockLib("550.54.15", a)
	inv := discover(lib, migMinors(t), zerolog.Nop())
	if err := inv.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	a.set(func(f *fakeGPU) { f.freeMiB, f.memCalls = 1, 0 })
	inv.refresh()
	inv.rediscover()
	if got := inv.Devices()[0].MemoryFreeMiB; got != 30000 {
		t.Errorf("free after Close = %d, want the last value 30000", got)
	}
	a.set(func(f *fakeGPU) {
		if f.memCalls != 0 {
			t.Errorf("GetMemoryInfo called %d times after Close (handles are invalid after Shutdown)", f.memCalls)
		}
	})
	if n := len(lib.InitCalls()); n != 1 {
		t.Errorf("Init called %d times, want 1: nothing restarts NVML after Close", n)
	}
}

func TestRunRefreshesEveryIntervalAndOnRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := a100()
		inv := discover(newMockLib("550.54.15", a), migMinors(t), zerolog.Nop())
		defer inv.Close()

		stop := running(t, inv, 10*time.Second)

		a.set(func(f *fakeGPU) { f.freeMiB = 5000 })
		time.Sleep(9 * time.Second)
		synctest.Wait()
		if got := inv.Devices()[0].MemoryFreeMiB; got != 30000 {
			t.Errorf("free before the first tick = %d, want 30000", got)
		}
		time.Sleep(2 * time.Second)
		synctest.Wait()
		if got := inv.Devices()[0].MemoryFreeMiB; got != 5000 {
			t.Errorf("free after the first tick = %d, want 5000", got)
		}

		// A replica exited: its memory shows back without waiting 10s.
		a.set(func(f *fakeGPU) { f.freeMiB = 40000 })
		inv.RefreshSoon()
		synctest.Wait()
		if got := inv.Devices()[0].MemoryFreeMiB; got != 40000 {
			t.Errorf("free right after RefreshSoon = %d, want 40000", got)
		}

		if err := stop(); err != nil {
			t.Errorf("Run() = %v, want nil", err)
		}
	})
}

func TestInventoryIsSafeForConcurrentUse(t *testing.T) {
	a, h := a100(), h100()
	inv := discover(newMockLib("550.54.15", a, h), migMinors(t), zerolog.Nop())
	t.Cleanup(func() { inv.Close() })
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				_ = inv.Devices()
				_ = inv.Count()
				_ = inv.Source()
				inv.RefreshSoon()
			}
		})
	}
	wg.Go(func() {
		for k := range 200 {
			a.set(func(f *fakeGPU) { f.freeMiB = uint64(k) })
			inv.refresh()
			if k%50 == 0 {
				inv.rediscover()
			}
		}
	})
	wg.Wait()
	if got := inv.Devices()[0].MemoryFreeMiB; got != 199 {
		t.Errorf("free = %d, want 199", got)
	}
}

func TestEnergyCounterIsReadWhereTheGPUHasOne(t *testing.T) {
	a, h := a100(), h100()
	a.set(func(f *fakeGPU) { f.energyMJ = 123456 })
	h.set(func(f *fakeGPU) { f.energyRet = nvml.ERROR_NOT_SUPPORTED })
	inv := discover(newMockLib("550.54.15", a, h), migMinors(t), zerolog.Nop())
	if mj, ok := inv.EnergyMillijoules(a.uuid); !ok || mj != 123456 {
		t.Errorf("A100 energy = %d, %v; want 123456 mJ", mj, ok)
	}
	a.set(func(f *fakeGPU) { f.energyMJ += 5000 })
	if mj, _ := inv.EnergyMillijoules(a.uuid); mj != 128456 {
		t.Errorf("after 5 J: %d mJ; the counter is read at each call", mj)
	}
	if _, ok := inv.EnergyMillijoules(h.uuid); ok {
		t.Error("a GPU without the counter (NOT_SUPPORTED) reported energy; want absent")
	}
	if _, ok := inv.EnergyMillijoules("GPU-nobody"); ok {
		t.Error("an unknown UUID reported energy")
	}
	if err := inv.Close(); err != nil {
		t.Fatal(err)
	}
	if _, ok := inv.EnergyMillijoules(a.uuid); ok {
		t.Error("energy read after Close (handles are invalid after Shutdown)")
	}
	sim := Simulated([]SimulatedGPU{{MemoryMiB: 1024}})
	if _, ok := sim.EnergyMillijoules(sim.Devices()[0].UUID); ok {
		t.Error("a simulated GPU reported energy; want absent")
	}
}
