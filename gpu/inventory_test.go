package gpu

import (
	"bytes"
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
)

// logLine is one decoded zerolog JSON line.
type logLine map[string]any

func (l logLine) level() string   { s, _ := l["level"].(string); return s }
func (l logLine) message() string { s, _ := l["message"].(string); return s }

// newTestLogger returns a logger writing JSON lines into a buffer, and a
// function decoding what was written so far.
func newTestLogger(t *testing.T) (zerolog.Logger, func() []logLine) {
	t.Helper()
	var buf bytes.Buffer
	log := zerolog.New(&buf)
	return log, func() []logLine {
		t.Helper()
		var lines []logLine
		for raw := range strings.Lines(buf.String()) {
			var l logLine
			if err := json.Unmarshal([]byte(raw), &l); err != nil {
				t.Fatalf("log line %q is not JSON: %v", raw, err)
			}
			lines = append(lines, l)
		}
		return lines
	}
}

func TestSimulatedListsSpecsInOrder(t *testing.T) {
	tests := []struct {
		name  string
		specs []SimulatedGPU
		want  []Device
	}{
		{
			name: "no specs",
			want: []Device{},
		},
		{
			name: "two GPUs keep spec order and free equals total",
			specs: []SimulatedGPU{
				{Name: "Sim A100", MemoryMiB: 40960},
				{Name: "Sim L4", MemoryMiB: 23034},
			},
			want: []Device{
				{Index: 0, UUID: "GPU-sim-0000-0000-0000-000000000000", Name: "Sim A100", MemoryTotalMiB: 40960, MemoryFreeMiB: 40960, Simulated: true},
				{Index: 1, UUID: "GPU-sim-0001-0000-0000-000000000001", Name: "Sim L4", Minor: 1, MemoryTotalMiB: 23034, MemoryFreeMiB: 23034, Simulated: true},
			},
		},
		{
			name:  "empty fields get defaults",
			specs: []SimulatedGPU{{}},
			want: []Device{
				{Index: 0, UUID: "GPU-sim-0000-0000-0000-000000000000", Name: "Simulated GPU", MemoryTotalMiB: 16384, MemoryFreeMiB: 16384, Simulated: true},
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := Simulated(tc.specs)
			if got := inv.Devices(); !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Devices() = %+v, want %+v", got, tc.want)
			}
			if got := inv.Count(); got != len(tc.want) {
				t.Errorf("Count() = %d, want %d", got, len(tc.want))
			}
			if got := inv.Source(); got != "simulated" {
				t.Errorf("Source() = %q, want simulated", got)
			}
			if err := inv.Close(); err != nil {
				t.Errorf("Close() = %v", err)
			}
		})
	}
}

func TestSimulatedUUIDsAreStableAndUnique(t *testing.T) {
	specs := make([]SimulatedGPU, 12)
	first, second := Simulated(specs).Devices(), Simulated(specs).Devices()
	seen := map[string]bool{}
	for k := range first {
		if first[k].UUID != second[k].UUID {
			t.Errorf("GPU %d: UUID %q then %q, want stable", k, first[k].UUID, second[k].UUID)
		}
		if !strings.HasPrefix(first[k].UUID, "GPU-sim-") {
			t.Errorf("GPU %d: UUID %q lacks GPU-sim- prefix", k, first[k].UUID)
		}
		if seen[first[k].UUID] {
			t.Errorf("GPU %d: duplicate UUID %q", k, first[k].UUID)
		}
		seen[first[k].UUID] = true
	}
}

func TestDevicesReturnsACopy(t *testing.T) {
	inv := Simulated([]SimulatedGPU{{Name: "a", MemoryMiB: 1024}})
	got := inv.Devices()
	got[0].MemoryFreeMiB = 0
	if again := inv.Devices(); again[0].MemoryFreeMiB != 1024 {
		t.Errorf("mutating the returned slice changed the inventory: free = %d", again[0].MemoryFreeMiB)
	}
}

func TestRunWithoutBackendReturnsWhenContextEnds(t *testing.T) {
	tests := []struct {
		name string
		inv  *Inventory
	}{
		{name: "simulated", inv: Simulated([]SimulatedGPU{{MemoryMiB: 1024}})},
		{name: "none", inv: empty(zerolog.Nop())},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ctx, cancel := context.WithCancel(t.Context())
				done := make(chan error, 1)
				go func() { done <- tc.inv.Run(ctx, time.Second) }()
				time.Sleep(time.Hour)
				synctest.Wait()
				select {
				case err := <-done:
					t.Fatalf("Run returned %v before the context ended", err)
				default:
				}
				before := tc.inv.Devices()
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run() = %v, want nil", err)
				}
				if after := tc.inv.Devices(); !reflect.DeepEqual(before, after) {
					t.Errorf("devices changed: %+v -> %+v", before, after)
				}
			})
		})
	}
}

func TestRunRejectsNonPositiveInterval(t *testing.T) {
	for _, every := range []time.Duration{0, -time.Second} {
		t.Run(every.String(), func(t *testing.T) {
			if err := Simulated(nil).Run(t.Context(), every); err == nil {
				t.Errorf("Run(ctx, %v) = nil, want error", every)
			}
		})
	}
}

// TestDiscoverOnThisMachine runs the real Discover. On a box without an
// NVIDIA driver (or a build without cgo) this is the real no-driver path:
// it must return an empty inventory with one log line, not kill the test
// binary.
func TestDiscoverOnThisMachine(t *testing.T) {
	log, lines := newTestLogger(t)
	inv := Discover(log)
	t.Cleanup(func() {
		if err := inv.Close(); err != nil {
			t.Errorf("Close() = %v", err)
		}
	})
	if strings.HasPrefix(inv.Source(), "nvml") {
		t.Logf("NVML present (%s): %d GPU(s): %+v", inv.Source(), inv.Count(), inv.Devices())
		if inv.Count() != len(inv.Devices()) {
			t.Errorf("Count() = %d, len(Devices()) = %d", inv.Count(), len(inv.Devices()))
		}
		return
	}
	if got := inv.Source(); got != "none" {
		t.Errorf("Source() = %q, want none", got)
	}
	if inv.Devices() == nil {
		t.Error("Devices() = nil, want an empty non-nil slice")
	}
	if inv.Count() != 0 || len(inv.Devices()) != 0 {
		t.Errorf("Count() = %d, Devices() = %+v, want empty", inv.Count(), inv.Devices())
	}
	got := lines()
	if len(got) != 1 {
		t.Fatalf("got %d log lines, want 1: %v", len(got), got)
	}
	msg := got[0].message()
	if msg != "no NVIDIA driver found: running on CPU only" &&
		msg != "built without cgo: NVML GPU discovery disabled" &&
		msg != "NVML init failed: running on CPU only" {
		t.Errorf("log message = %q, want a CPU-only notice", msg)
	}
	t.Logf("log: %v", got[0])
}
