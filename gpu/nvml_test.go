//go:build cgo

package gpu

import (
	"context"
	"fmt"
	"maps"
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

// fakeGPU is the state behind one mock.Device. Its fields may be changed
// while a refresh runs, so every read and write holds mu.
type fakeGPU struct {
	mu        sync.Mutex
	index     int
	uuid      string
	name      string
	totalMiB  uint64
	freeMiB   uint64
	util      uint32
	utilRet   nvml.Return
	migMode   int
	migRet    nvml.Return
	memRet    nvml.Return
	uuidRet   nvml.Return
	handleRet nvml.Return // returned by DeviceGetHandleByIndex for this GPU
	memCalls  int         // GetMemoryInfo calls so far
}

func (f *fakeGPU) set(change func(f *fakeGPU)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	change(f)
}

// device returns a mock.Device with every method discovery and refresh
// call; any other method panics (the mock's default), failing the test.
func (f *fakeGPU) device() *mock.Device {
	return &mock.Device{
		GetIndexFunc: func() (int, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.index, nvml.SUCCESS
		},
		GetUUIDFunc: func() (string, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.uuid, f.uuidRet
		},
		GetNameFunc: func() (string, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.name, nvml.SUCCESS
		},
		GetMemoryInfoFunc: func() (nvml.Memory, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.memCalls++
			return nvml.Memory{
				Total: f.totalMiB * mib,
				Free:  f.freeMiB * mib,
				Used:  (f.totalMiB - f.freeMiB) * mib,
			}, f.memRet
		},
		GetUtilizationRatesFunc: func() (nvml.Utilization, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return nvml.Utilization{Gpu: f.util, Memory: f.util / 2}, f.utilRet
		},
		GetMigModeFunc: func() (int, int, nvml.Return) {
			f.mu.Lock()
			defer f.mu.Unlock()
			return f.migMode, f.migMode, f.migRet
		},
	}
}

// a100 and h100 return healthy fake GPUs; tests change what they need.
func a100() *fakeGPU {
	return &fakeGPU{index: 0, uuid: "GPU-aaaaaaaa-0000-0000-0000-000000000000", name: "NVIDIA A100-SXM4-40GB",
		totalMiB: 40960, freeMiB: 30000, util: 12, migMode: nvml.DEVICE_MIG_DISABLE}
}

func h100() *fakeGPU {
	return &fakeGPU{index: 1, uuid: "GPU-bbbbbbbb-0000-0000-0000-000000000000", name: "NVIDIA H100 80GB HBM3",
		totalMiB: 81559, freeMiB: 81000, util: 55, migMode: nvml.DEVICE_MIG_DISABLE}
}

// newMockLib returns a mock NVML whose Init succeeds and that enumerates
// gpus in order.
func newMockLib(driver string, gpus ...*fakeGPU) *mock.Interface {
	devs := make([]*mock.Device, len(gpus))
	for k, g := range gpus {
		devs[k] = g.device()
	}
	return &mock.Interface{
		InitFunc:     func() nvml.Return { return nvml.SUCCESS },
		ShutdownFunc: func() nvml.Return { return nvml.SUCCESS },
		SystemGetDriverVersionFunc: func() (string, nvml.Return) {
			if driver == "" {
				return "", nvml.ERROR_UNKNOWN
			}
			return driver, nvml.SUCCESS
		},
		DeviceGetCountFunc: func() (int, nvml.Return) { return len(gpus), nvml.SUCCESS },
		DeviceGetHandleByIndexFunc: func(n int) (nvml.Device, nvml.Return) {
			if n < 0 || n >= len(gpus) {
				return nil, nvml.ERROR_INVALID_ARGUMENT
			}
			gpus[n].mu.Lock()
			defer gpus[n].mu.Unlock()
			if gpus[n].handleRet != nvml.SUCCESS {
				return nil, gpus[n].handleRet
			}
			return devs[n], nvml.SUCCESS
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

func TestDiscoverMapsNVMLDevices(t *testing.T) {
	tests := []struct {
		name       string
		driver     string
		gpus       func() []*fakeGPU
		wantSource string
		want       []Device
		// wantWarns holds, per expected warning line, substrings of that
		// line's fields ("uuid"/"index"/"error" values and message).
		wantWarns [][]string
	}{
		{
			name:   "two devices, MIG off and on",
			driver: "550.54.15",
			gpus: func() []*fakeGPU {
				g := h100()
				g.migMode = nvml.DEVICE_MIG_ENABLE
				g.utilRet = nvml.ERROR_NOT_SUPPORTED
				return []*fakeGPU{a100(), g}
			},
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 0, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000", Name: "NVIDIA A100-SXM4-40GB", MemoryTotalMiB: 40960, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1},
				{Index: 1, UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3", MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, UtilizationPct: 0, MIG: true, Samples: 1},
			},
		},
		{
			name:   "MIG not supported reads as off",
			driver: "470.256.02",
			gpus: func() []*fakeGPU {
				g := a100()
				g.migRet = nvml.ERROR_NOT_SUPPORTED
				g.migMode = 0
				return []*fakeGPU{g}
			},
			wantSource: "nvml (driver 470.256.02)",
			want: []Device{
				{Index: 0, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000", Name: "NVIDIA A100-SXM4-40GB", MemoryTotalMiB: 40960, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1},
			},
		},
		{
			name:       "devices are sorted by NVML index",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { a, h := a100(), h100(); a.index, h.index = 1, 0; return []*fakeGPU{a, h} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 0, UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3", MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, UtilizationPct: 55, Samples: 1},
				{Index: 1, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000", Name: "NVIDIA A100-SXM4-40GB", MemoryTotalMiB: 40960, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1},
			},
		},
		{
			name:       "one device's memory query fails: the other is listed",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { g := h100(); g.memRet = nvml.ERROR_UNKNOWN; return []*fakeGPU{a100(), g} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 0, UUID: "GPU-aaaaaaaa-0000-0000-0000-000000000000", Name: "NVIDIA A100-SXM4-40GB", MemoryTotalMiB: 40960, MemoryFreeMiB: 30000, UtilizationPct: 12, Samples: 1},
			},
			wantWarns: [][]string{{"skipping GPU", "GPU-bbbbbbbb-0000-0000-0000-000000000000", "get memory info", "ERROR_UNKNOWN"}},
		},
		{
			name:       "a lost GPU's handle fails: the other is listed",
			driver:     "550.54.15",
			gpus:       func() []*fakeGPU { g := a100(); g.handleRet = nvml.ERROR_GPU_IS_LOST; return []*fakeGPU{g, h100()} },
			wantSource: "nvml (driver 550.54.15)",
			want: []Device{
				{Index: 1, UUID: "GPU-bbbbbbbb-0000-0000-0000-000000000000", Name: "NVIDIA H100 80GB HBM3", MemoryTotalMiB: 81559, MemoryFreeMiB: 81000, UtilizationPct: 55, Samples: 1},
			},
			wantWarns: [][]string{{"skipping GPU", "index=0", "ERROR_GPU_IS_LOST"}},
		},
		{
			name:   "UUID and utilization failures skip each device",
			driver: "550.54.15",
			gpus: func() []*fakeGPU {
				a, h := a100(), h100()
				a.uuidRet = nvml.ERROR_UNKNOWN
				h.utilRet = nvml.ERROR_TIMEOUT
				return []*fakeGPU{a, h}
			},
			wantSource: "nvml (driver 550.54.15)",
			want:       []Device{},
			wantWarns: [][]string{
				{"skipping GPU", "index=0", "get UUID"},
				{"skipping GPU", "index=1", "GPU-bbbbbbbb-0000-0000-0000-000000000000", "get utilization", "ERROR_TIMEOUT"},
			},
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
			lib := newMockLib(tc.driver, tc.gpus()...)
			inv := discover(lib, log)

			if got := inv.Source(); got != tc.wantSource {
				t.Errorf("Source() = %q, want %q", got, tc.wantSource)
			}
			if got := inv.Devices(); !slices.Equal(got, tc.want) {
				t.Errorf("Devices() =\n  %+v\nwant\n  %+v", got, tc.want)
			}
			if got := inv.Count(); got != len(tc.want) {
				t.Errorf("Count() = %d, want %d", got, len(tc.want))
			}
			warns := warnings(lines())
			if len(warns) != len(tc.wantWarns) {
				t.Fatalf("got %d warnings, want %d: %v", len(warns), len(tc.wantWarns), warns)
			}
			for k, subs := range tc.wantWarns {
				text := flatten(warns[k])
				for _, s := range subs {
					if !strings.Contains(text, s) {
						t.Errorf("warning %d = %q, want it to contain %q", k, text, s)
					}
				}
			}

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

// flatten renders a log line as sorted "key=value" pairs for substring
// checks.
func flatten(l logLine) string {
	var b strings.Builder
	for _, k := range slices.Sorted(maps.Keys(l)) {
		fmt.Fprintf(&b, "%s=%v ", k, l[k])
	}
	return b.String()
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
			// After a failed Init the real library kills the process on any
			// other call. nvmlLib has exactly these methods besides Init
			// (devices are reachable only through DeviceGetHandleByIndex),
			// so each one fails the test; every other mock method panics.
			called := func(name string) { t.Errorf("%s called after Init failed with %v", name, tc.ret) }
			lib := &mock.Interface{
				InitFunc:     func() nvml.Return { return tc.ret },
				ShutdownFunc: func() nvml.Return { called("Shutdown"); return nvml.SUCCESS },
				SystemGetDriverVersionFunc: func() (string, nvml.Return) {
					called("SystemGetDriverVersion")
					return "", nvml.SUCCESS
				},
				DeviceGetCountFunc: func() (int, nvml.Return) { called("DeviceGetCount"); return 0, nvml.SUCCESS },
				DeviceGetHandleByIndexFunc: func(int) (nvml.Device, nvml.Return) {
					called("DeviceGetHandleByIndex")
					return nil, nvml.SUCCESS
				},
			}

			inv := discover(lib, log)
			// The whole life of the inventory must stay off NVML too.
			inv.refresh()
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

func TestDiscoverDeviceCountFailureShutsDown(t *testing.T) {
	log, lines := newTestLogger(t)
	lib := newMockLib("550.54.15", a100())
	lib.DeviceGetCountFunc = func() (int, nvml.Return) { return 0, nvml.ERROR_UNKNOWN }

	inv := discover(lib, log)
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
		change    func(a, h *fakeGPU)
		wantFree  [2]uint64
		wantUtil  [2]int
		wantWarns int // warning lines logged during this step
		// wantSamples: successful reads per GPU so far, discovery included.
		wantSamples [2]uint64
	}
	tests := []struct {
		name  string
		steps []step
	}{
		{
			name: "free memory and utilization follow NVML",
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
			name: "a failing device keeps its last values and warns once per streak",
			steps: []step{
				{
					change:   func(a, h *fakeGPU) { a.memRet = nvml.ERROR_GPU_IS_LOST; a.freeMiB = 1; h.freeMiB = 70000 },
					wantFree: [2]uint64{30000, 70000}, wantUtil: [2]int{12, 55}, wantWarns: 1, wantSamples: [2]uint64{1, 2},
				},
				{
					change:   func(a, h *fakeGPU) { h.freeMiB = 60000 },
					wantFree: [2]uint64{30000, 60000}, wantUtil: [2]int{12, 55}, wantWarns: 0, wantSamples: [2]uint64{1, 3},
				},
				{
					change:   func(a, h *fakeGPU) { a.memRet = nvml.SUCCESS },
					wantFree: [2]uint64{1, 60000}, wantUtil: [2]int{12, 55}, wantWarns: 0, wantSamples: [2]uint64{2, 4},
				},
				{
					change:   func(a, h *fakeGPU) { a.utilRet = nvml.ERROR_UNKNOWN; a.freeMiB = 2 },
					wantFree: [2]uint64{1, 60000}, wantUtil: [2]int{12, 55}, wantWarns: 1, wantSamples: [2]uint64{2, 5},
				},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			log, lines := newTestLogger(t)
			a, h := a100(), h100()
			inv := discover(newMockLib("550.54.15", a, h), log)
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

func TestRefreshAfterCloseQueriesNothing(t *testing.T) {
	a := a100()
	lib := newMockLib("550.54.15", a)
	inv := discover(lib, zerolog.Nop())
	if err := inv.Close(); err != nil {
		t.Fatalf("Close() = %v", err)
	}
	a.set(func(f *fakeGPU) { f.freeMiB, f.memCalls = 1, 0 })
	inv.refresh()
	if got := inv.Devices()[0].MemoryFreeMiB; got != 30000 {
		t.Errorf("free after Close = %d, want the last value 30000", got)
	}
	a.set(func(f *fakeGPU) {
		if f.memCalls != 0 {
			t.Errorf("GetMemoryInfo called %d times after Close (handles are invalid after Shutdown)", f.memCalls)
		}
	})
}

func TestRunRefreshesEveryInterval(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		a := a100()
		inv := discover(newMockLib("550.54.15", a), zerolog.Nop())
		defer inv.Close()

		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- inv.Run(ctx, 10*time.Second) }()

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

		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run() = %v, want nil", err)
		}
	})
}

func TestInventoryIsSafeForConcurrentUse(t *testing.T) {
	a, h := a100(), h100()
	inv := discover(newMockLib("550.54.15", a, h), zerolog.Nop())
	t.Cleanup(func() { inv.Close() })
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for range 200 {
				_ = inv.Devices()
				_ = inv.Count()
				_ = inv.Source()
			}
		})
	}
	wg.Go(func() {
		for k := range 200 {
			a.set(func(f *fakeGPU) { f.freeMiB = uint64(k) })
			inv.refresh()
		}
	})
	wg.Wait()
	if got := inv.Devices()[0].MemoryFreeMiB; got != 199 {
		t.Errorf("free = %d, want 199", got)
	}
}
