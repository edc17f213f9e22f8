package local

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"inferd/gpu"
	"inferd/scheduler/backend"
)

// recordingTool is a checkpointTool that does nothing to the driver but
// records what it was asked, and fails as told.
type recordingTool struct {
	mu                   sync.Mutex
	unsupported          error
	failPark             error
	parked, restored     [][]int
	parkedGPU            [][]int
	checkpointedAnswered []int // what park answers as checkpointed
}

func (r *recordingTool) support() error { return r.unsupported }

func (r *recordingTool) park(_ context.Context, pids, gpuPids []int) ([]int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.failPark != nil {
		return nil, r.failPark
	}
	r.parked = append(r.parked, pids)
	r.parkedGPU = append(r.parkedGPU, gpuPids)
	return r.checkpointedAnswered, nil
}

func (r *recordingTool) restore(_ context.Context, pids []int) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.restored = append(r.restored, pids)
	return nil
}

// frozen reports whether the kernel has p frozen: its cgroup v2 says so, or
// without one every process of it is stopped.
func frozen(t *testing.T, p *Process) bool {
	t.Helper()
	if cg := p.box.cg; cg != nil && cg.v2 != "" {
		data, err := os.ReadFile(filepath.Join(cg.v2, "cgroup.events"))
		if err != nil {
			t.Fatal(err)
		}
		return strings.Contains(string(data), "frozen 1")
	}
	pids, err := p.members()
	if err != nil || len(pids) == 0 {
		t.Fatalf("members %v, %v", pids, err)
	}
	for _, pid := range pids {
		if _, state, ok := procStat(pid); !ok || state != 'T' {
			return false
		}
	}
	return true
}

func TestParkFreezesTheReplicaAndRestoreThawsIt(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
	}{
		{"in its cgroup", func(*Config) {}},
		{"without a cgroup (SIGSTOP)", func(c *Config) { c.NoCgroups = true; hostNetwork(c) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			gpus := fixedInventory{{UUID: "GPU-A", Simulated: true}}
			b := testBackendWith(t, func(c *Config) { tc.set(c); c.GPUs = gpus })
			tool := &recordingTool{checkpointedAnswered: []int{4242}}
			b.ckpt = tool
			spec := echoSpec(t, "park-1")
			spec.GPUs = []string{"GPU-A"}
			p := startReady(t, b, spec)
			if tc.name == "in its cgroup" && (p.box.cg == nil || p.box.cg.v2 == "") {
				t.Skip("no cgroup v2 per replica on this host")
			}
			infer(t, p, `{"spawn": true}`) // a second process in the replica

			rep, err := b.Park(context.Background(), p)
			if err != nil {
				t.Fatal(err)
			}
			if rep.CUDAProcesses != 1 {
				t.Errorf("report %+v, want the tool's one checkpointed process", rep)
			}
			if !frozen(t, p) {
				t.Error("the parked replica is not frozen")
			}
			members, _ := p.members()
			if len(tool.parked) != 1 || !slices.Contains(tool.parked[0], p.pid) || len(tool.parked[0]) != len(members) {
				t.Errorf("the tool was asked to park %v, want every process of the replica %v", tool.parked, members)
			}

			if err := b.Restore(context.Background(), p); err != nil {
				t.Fatal(err)
			}
			if frozen(t, p) {
				t.Error("the restored replica is still frozen")
			}
			if len(tool.restored) != 1 || !slices.Equal(tool.restored[0], []int{4242}) {
				t.Errorf("restored %v, want what park checkpointed", tool.restored)
			}
			if r := infer(t, p, `{"n": 1}`); r.Echo["n"] != float64(1) {
				t.Errorf("after restore the model answered %v", r.Echo)
			}
		})
	}
}

// NVML's processes on the replica's GPUs must be checkpointed: the tool is
// told which they are.
func TestParkNamesTheProcessesNVMLListsOnTheReplicasGPUs(t *testing.T) {
	inv := fixedInventory{{UUID: "GPU-A", Simulated: true}, {UUID: "GPU-B", Simulated: true}}
	b := testBackendWith(t, func(c *Config) { c.GPUs = inv })
	tool := &recordingTool{}
	b.ckpt = tool
	spec := echoSpec(t, "park-gpu")
	spec.GPUs = []string{"GPU-A"}
	p := startReady(t, b, spec)
	inv[0].Processes = []gpu.Process{{Pid: p.pid, UsedMiB: 900}, {Pid: 1, UsedMiB: 10}} // pid 1: not the replica's
	inv[1].Processes = []gpu.Process{{Pid: p.pid, UsedMiB: 5}}                          // not its GPU
	if _, err := b.Park(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	if len(tool.parkedGPU) != 1 || !slices.Equal(tool.parkedGPU[0], []int{p.pid}) {
		t.Errorf("GPU processes named %v, want [%d]", tool.parkedGPU, p.pid)
	}
	if err := b.Restore(context.Background(), p); err != nil {
		t.Fatal(err)
	}
}

func TestAParkedReplicaIsKilledAtOnceWhenStopped(t *testing.T) {
	// A grace far beyond the test's deadline: a Stop that waited it out
	// would not be seen to end.
	b := testBackendWith(t, func(c *Config) { c.StopGrace = time.Hour })
	b.ckpt = &recordingTool{}
	p := startReady(t, b, echoSpec(t, "park-stop"))
	if _, err := b.Park(context.Background(), p); err != nil {
		t.Fatal(err)
	}
	go p.Stop()
	waitExited(t, p)
	// echo exits 0 on SIGTERM: a kill says the grace was not waited out.
	var exit interface{ Sys() any }
	if err := p.ExitErr(); !errors.As(err, &exit) || exit.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
		t.Errorf("a parked replica ended with %v, want SIGKILL", err)
	}
}

func TestParkThatCannotOrFailsLeavesTheReplicaServing(t *testing.T) {
	for _, tc := range []struct {
		name        string
		tool        *recordingTool
		unsupported bool
	}{
		{"no checkpoint API", &recordingTool{unsupported: errors.New("no NVIDIA GPU on this box")}, true},
		{"the checkpoint fails", &recordingTool{failPark: errors.New("cuCheckpointProcessLock: CUDA_ERROR_TIMEOUT")}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := testBackend(t)
			b.ckpt = tc.tool
			p := startReady(t, b, echoSpec(t, "park-no"))
			_, err := b.Park(context.Background(), p)
			if err == nil || errors.Is(err, backend.ErrParkUnsupported) != tc.unsupported {
				t.Fatalf("Park = %v, want an error (unsupported: %v)", err, tc.unsupported)
			}
			if b.ParkSupport() != tc.tool.unsupported {
				t.Errorf("ParkSupport = %v", b.ParkSupport())
			}
			if frozen(t, p) {
				t.Error("frozen after a failed Park")
			}
			if r := infer(t, p, `{"n": 2}`); r.Echo["n"] != float64(2) {
				t.Errorf("the model answered %v", r.Echo)
			}
			if err := b.Restore(context.Background(), p); err == nil {
				t.Error("Restore of a replica that is not parked succeeded")
			}
		})
	}
}

// fakeHelper writes an executable script that answers like `inferd
// cuda-checkpoint` would with body and exits with code, and records its
// arguments in the returned file.
func fakeHelper(t *testing.T, body string, code int) (argv []string, argsFile string) {
	t.Helper()
	dir := t.TempDir()
	argsFile = filepath.Join(dir, "args")
	script := filepath.Join(dir, "helper")
	src := "#!/bin/sh\necho \"$@\" >> " + argsFile + "\ncat <<'EOF'\n" + body + "\nEOF\nexit " + string(rune('0'+code)) + "\n"
	if err := os.WriteFile(script, []byte(src), 0o755); err != nil {
		t.Fatal(err)
	}
	return []string{script}, argsFile
}

func TestHelperToolReadsTheHelpersAnswers(t *testing.T) {
	real := fixedInventory{{UUID: "GPU-real"}}
	t.Run("park", func(t *testing.T) {
		argv, args := fakeHelper(t, `{"checkpointed":[11,12],"skipped":{"13":"CUDA_ERROR_NOT_INITIALIZED"}}`, 0)
		h := &helperTool{argv: argv, gpus: real.Devices}
		got, err := h.park(context.Background(), []int{11, 12, 13}, []int{11})
		if err != nil || !slices.Equal(got, []int{11, 12}) {
			t.Fatalf("park = %v, %v", got, err)
		}
		if data, _ := os.ReadFile(args); strings.TrimSpace(string(data)) != "park --timeout-ms 10000 --gpu-pids 11 11 12 13" {
			t.Errorf("helper ran with %q", data)
		}
	})
	t.Run("a driver without the API", func(t *testing.T) {
		argv, _ := fakeHelper(t, `{"error":"the CUDA checkpoint API is not available: ...","unsupported":true}`, 1)
		h := &helperTool{argv: argv, gpus: real.Devices}
		if _, err := h.park(context.Background(), []int{11}, nil); !errors.Is(err, backend.ErrParkUnsupported) {
			t.Errorf("park = %v, want ErrParkUnsupported", err)
		}
	})
	t.Run("a failure", func(t *testing.T) {
		argv, _ := fakeHelper(t, `{"error":"cuCheckpointProcessRestore(pid 11): CUDA_ERROR_OUT_OF_MEMORY (2)","unsupported":false}`, 1)
		h := &helperTool{argv: argv, gpus: real.Devices}
		err := h.restore(context.Background(), []int{11})
		if err == nil || errors.Is(err, backend.ErrParkUnsupported) || !strings.Contains(err.Error(), "CUDA_ERROR_OUT_OF_MEMORY") {
			t.Errorf("restore = %v", err)
		}
	})
	t.Run("support is asked once when there is the API", func(t *testing.T) {
		argv, args := fakeHelper(t, "the CUDA driver (CUDA 13.0) has the checkpoint API", 0)
		h := &helperTool{argv: argv, gpus: real.Devices}
		for range 3 {
			if err := h.support(); err != nil {
				t.Fatal(err)
			}
		}
		if data, _ := os.ReadFile(args); strings.Count(string(data), "check") != 1 {
			t.Errorf("helper ran %q, want one check", data)
		}
	})
	t.Run("support says why not", func(t *testing.T) {
		argv, _ := fakeHelper(t, "inferd: the CUDA checkpoint API is not available: the NVIDIA driver (CUDA 12.4) has no cuCheckpointProcessLock: driver 570 or later is needed", 1)
		h := &helperTool{argv: argv, gpus: real.Devices}
		if err := h.support(); err == nil || !strings.HasPrefix(err.Error(), "the CUDA checkpoint API is not available") {
			t.Errorf("support = %v", err)
		}
	})
	t.Run("simulated GPUs: the helper is not run", func(t *testing.T) {
		argv, args := fakeHelper(t, "", 0)
		h := &helperTool{argv: argv, gpus: fixedInventory{{UUID: "GPU-sim", Simulated: true}}.Devices}
		if err := h.support(); err == nil {
			t.Error("support on simulated GPUs = nil")
		}
		if _, err := os.Stat(args); !os.IsNotExist(err) {
			t.Error("the helper ran for simulated GPUs")
		}
	})
	t.Run("restore of nothing checkpointed runs nothing", func(t *testing.T) {
		argv, args := fakeHelper(t, "", 1)
		h := &helperTool{argv: argv, gpus: real.Devices}
		if err := h.restore(context.Background(), nil); err != nil {
			t.Error(err)
		}
		if _, err := os.Stat(args); !os.IsNotExist(err) {
			t.Error("the helper ran")
		}
	})
}
