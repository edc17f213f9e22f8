package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"inferd/gpu"
	"inferd/scheduler/backend"
)

// Parking (backend.Checkpointer; the scheduler's parking.go decides when):
// a replica's CUDA processes are checkpointed through the CUDA driver's
// checkpoint API, their GPU memory moved into their own host memory (their
// cgroup's memory limit counts it), then the whole replica is frozen: its
// cgroup v2 frozen where it has one, else every process of it stopped
// (SIGSTOP). Restore thaws it first (the driver's restore runs a thread of
// the process), then restores and unlocks its CUDA processes. A parked
// replica is stopped with SIGKILL at once: nothing in it can answer a
// SIGTERM, and nothing in it is in flight.
//
// The driver is never called from the daemon: a checkpointTool does it in a
// process of its own (inferd cuda-checkpoint, package cli), so that neither
// the driver's state nor a fault in it reaches the daemon.

var _ backend.Checkpointer = (*Backend)(nil)

// checkpointTool reaches the CUDA driver's checkpoint API for other
// processes.
type checkpointTool interface {
	// support says whether this box can checkpoint: nil, or why not.
	support() error
	// park checkpoints the CUDA processes among pids (those of gpuPids
	// must be) and returns those it checkpointed; on an error nothing
	// stays checkpointed. An error wrapping backend.ErrParkUnsupported
	// means the driver cannot do it at all.
	park(ctx context.Context, pids, gpuPids []int) ([]int, error)
	// restore brings pids' GPU state back and unlocks them.
	restore(ctx context.Context, pids []int) error
}

// Parking's time bounds where the caller gives none.
const (
	// supportCheckWait bounds `cuda-checkpoint check` (loading the driver).
	supportCheckWait = 30 * time.Second
	// supportRecheck is how long a negative answer of support is kept: a
	// driver installed later is seen within it.
	supportRecheck = time.Minute
	// lockWait is how long the driver waits for a replica's CUDA calls in
	// flight before a lock fails: an idle replica has none.
	lockWait = 10 * time.Second
	// freezeWait bounds freezing or thawing a replica.
	freezeWait = 10 * time.Second
)

// ParkSupportOf is ParkSupport for a box with gpus, without a backend:
// for the checks apply and doctor make with no daemon.
func ParkSupportOf(gpus Inventory) func() error { return checkpointToolFor(Config{GPUs: gpus}).support }

// ParkSupport says whether this backend can park replicas here (see
// backend.Checkpointer): the answer of `inferd cuda-checkpoint check`,
// kept for supportRecheck when negative, for good when positive.
func (b *Backend) ParkSupport() error { return b.ckpt.support() }

// Park checkpoints replica inst's GPU state and freezes it; see
// backend.Checkpointer.
func (b *Backend) Park(ctx context.Context, inst backend.Instance) (backend.ParkReport, error) {
	p, ok := inst.(*Process)
	if !ok {
		return backend.ParkReport{}, fmt.Errorf("park: %T is not a replica of this backend", inst)
	}
	if err := b.ckpt.support(); err != nil {
		return backend.ParkReport{}, fmt.Errorf("%w: %w", backend.ErrParkUnsupported, err)
	}
	return p.park(ctx)
}

// Restore thaws replica inst and restores its GPU state; see
// backend.Checkpointer.
func (b *Backend) Restore(ctx context.Context, inst backend.Instance) error {
	p, ok := inst.(*Process)
	if !ok {
		return fmt.Errorf("restore: %T is not a replica of this backend", inst)
	}
	return p.restore(ctx)
}

// parking is a Process's parked state. mu serialises Park and Restore of
// one replica; Stop reads parked without waiting for them.
type parking struct {
	mu     sync.Mutex
	parked atomic.Bool // frozen, its CUDA processes checkpointed; set under mu
	cuda   []int       // the processes checkpointed, to restore; guarded by mu
}

func (p *Process) park(ctx context.Context) (backend.ParkReport, error) {
	pk := &p.parking
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if err := p.exitedErr(); err != nil {
		return backend.ParkReport{}, err
	}
	if pk.parked.Load() {
		return backend.ParkReport{}, errors.New("park: the replica is parked already")
	}
	pids, err := p.members()
	if err != nil {
		return backend.ParkReport{}, fmt.Errorf("park: %w", err)
	}
	cuda, err := p.b.ckpt.park(ctx, pids, p.gpuPids(pids))
	if err != nil {
		return backend.ParkReport{}, fmt.Errorf("park: %w", err)
	}
	if err := p.freeze(ctx, true); err != nil {
		// Back to running as it was; the caller stops it if that fails too.
		err = fmt.Errorf("park: freeze: %w", err)
		return backend.ParkReport{}, errors.Join(err, p.freeze(context.Background(), false), p.b.ckpt.restore(context.Background(), cuda))
	}
	pk.cuda = cuda
	pk.parked.Store(true)
	p.log.Info().Ints("cudaPids", cuda).Ints("pids", pids).Msg("replica parked: its GPU memory is in host memory, its processes frozen")
	return backend.ParkReport{CUDAProcesses: len(cuda)}, nil
}

func (p *Process) restore(ctx context.Context) error {
	pk := &p.parking
	pk.mu.Lock()
	defer pk.mu.Unlock()
	if err := p.exitedErr(); err != nil {
		return err
	}
	if !pk.parked.Load() {
		return errors.New("restore: the replica is not parked")
	}
	if err := p.freeze(ctx, false); err != nil {
		return fmt.Errorf("restore: thaw: %w", err)
	}
	if err := p.b.ckpt.restore(ctx, pk.cuda); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	pk.parked.Store(false)
	pk.cuda = nil
	p.log.Info().Msg("replica restored from parking")
	return nil
}

// members lists the replica's processes: its cgroup's, or without one its
// process group's.
func (p *Process) members() ([]int, error) {
	if cg := p.box.cg; cg != nil {
		dir := cg.v2
		for _, d := range cg.v1 {
			if dir == "" {
				dir = d // every process is in each of its v1 cgroups too
			}
		}
		if dir != "" {
			return cgroupPids(dir)
		}
	}
	groups, err := processGroups()
	if err != nil {
		return nil, err
	}
	return groups[p.pid], nil
}

// gpuPids are those of pids that NVML lists on the replica's GPUs: they
// use the GPU, so they must be checkpointed, not skipped.
func (p *Process) gpuPids(pids []int) []int {
	if p.b.cfg.GPUs == nil {
		return nil
	}
	var out []int
	for _, d := range p.b.cfg.GPUs.Devices() {
		if !slices.Contains(p.spec.GPUs, d.UUID) {
			continue
		}
		for _, pr := range d.Processes {
			if slices.Contains(pids, pr.Pid) && !slices.Contains(out, pr.Pid) {
				out = append(out, pr.Pid)
			}
		}
	}
	return out
}

// freeze freezes the replica (on) or thaws it: through its cgroup v2's
// freezer where it has one, which a process cannot notice or undo, else by
// SIGSTOP (SIGCONT) to each of its processes. It returns once the kernel
// says all are frozen (thawed), or with ctx's end, within freezeWait.
func (p *Process) freeze(ctx context.Context, on bool) error {
	ctx, cancel := context.WithTimeout(ctx, freezeWait)
	defer cancel()
	if cg := p.box.cg; cg != nil && cg.v2 != "" {
		return freezeCgroup(ctx, cg.v2, on)
	}
	pids, err := p.members()
	if err != nil {
		return err
	}
	sig := syscall.SIGSTOP
	if !on {
		sig = syscall.SIGCONT
	}
	for _, pid := range pids {
		syscall.Kill(pid, sig)
	}
	return pollUntil(ctx, func() (bool, error) {
		for _, pid := range pids {
			if _, state, ok := procStat(pid); ok && (state == 'T') != on && state != 'Z' {
				return false, nil
			}
		}
		return true, nil
	})
}

// freezeCgroup sets cgroup v2 dir's freezer and waits until cgroup.events
// reports it done.
func freezeCgroup(ctx context.Context, dir string, on bool) error {
	want := "frozen 0"
	value := "0"
	if on {
		want, value = "frozen 1", "1"
	}
	if err := writeCgroup(dir, "cgroup.freeze", value); err != nil {
		return err
	}
	events := filepath.Join(dir, "cgroup.events")
	return pollUntil(ctx, func() (bool, error) {
		data, err := os.ReadFile(events)
		if err != nil {
			return false, fmt.Errorf("cgroup %s: %w", dir, errBrief(err))
		}
		return bytes.Contains(data, []byte(want)), nil
	})
}

// pollUntil calls done, pausing 1 ms doubling to 20 ms between calls, until
// it reports true, fails, or ctx ends. A freeze takes the kernel about a
// millisecond and signals nothing a reader could wait on cheaply.
func pollUntil(ctx context.Context, done func() (bool, error)) error {
	for pause := time.Millisecond; ; pause = min(2*pause, 20*time.Millisecond) {
		ok, err := done()
		if ok || err != nil {
			return err
		}
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

// helperTool runs `inferd cuda-checkpoint` (this very binary:
// /proc/self/exe, which stays runnable while a package upgrade replaces the
// file) in a process of its own.
type helperTool struct {
	argv []string            // the helper command, without its action
	gpus func() []gpu.Device // the box's GPUs; nil = none

	mu      sync.Mutex
	checked time.Time // when err was found; zero = never checked
	err     error     // support's last answer
}

func newHelperTool(gpus Inventory) *helperTool {
	h := &helperTool{argv: []string{"/proc/self/exe", "cuda-checkpoint"}}
	if gpus != nil {
		h.gpus = gpus.Devices
	}
	return h
}

// support runs `cuda-checkpoint check`, only on a box with a real NVIDIA
// GPU: simulated GPUs have no driver to ask.
func (h *helperTool) support() error {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.checked.IsZero() && (h.err == nil || time.Since(h.checked) < supportRecheck) {
		return h.err
	}
	var devs []gpu.Device
	if h.gpus != nil {
		devs = h.gpus()
	}
	if !slices.ContainsFunc(devs, func(d gpu.Device) bool { return !d.Simulated }) {
		// Not kept: a driver that loads later brings GPUs with it.
		return errors.New("no NVIDIA GPU on this box (simulated GPUs cannot be parked)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), supportCheckWait)
	defer cancel()
	out, err := h.command(ctx, "check").CombinedOutput()
	h.checked, h.err = time.Now(), nil
	if err != nil {
		h.err = fmt.Errorf("%s", helperMessage(out, err))
	}
	return h.err
}

func (h *helperTool) command(ctx context.Context, action string, args ...string) *exec.Cmd {
	argv := append(append(slices.Clone(h.argv[1:]), action), args...)
	cmd := exec.CommandContext(ctx, h.argv[0], argv...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")} // the driver needs nothing of the daemon's
	if v, ok := os.LookupEnv("LD_LIBRARY_PATH"); ok {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+v) // where libcuda.so.1 may be found
	}
	return cmd
}

func (h *helperTool) park(ctx context.Context, pids, gpuPids []int) ([]int, error) {
	args := []string{"--timeout-ms", strconv.Itoa(int(lockWait / time.Millisecond))}
	if len(gpuPids) > 0 {
		args = append(args, "--gpu-pids", strings.Join(pidArgs(gpuPids), ","))
	}
	var res struct {
		Checkpointed []int          `json:"checkpointed"`
		Skipped      map[int]string `json:"skipped"`
	}
	if err := h.run(ctx, "park", append(args, pidArgs(pids)...), &res); err != nil {
		return nil, err
	}
	return res.Checkpointed, nil
}

func (h *helperTool) restore(ctx context.Context, pids []int) error {
	if len(pids) == 0 {
		return nil // nothing was checkpointed: thawing was all
	}
	return h.run(ctx, "restore", pidArgs(pids), nil)
}

// run runs a park or restore and reads its one JSON answer into res.
func (h *helperTool) run(ctx context.Context, action string, args []string, res any) error {
	var stdout, stderr bytes.Buffer
	cmd := h.command(ctx, action, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	runErr := cmd.Run()
	var failure struct {
		Error       string `json:"error"`
		Unsupported bool   `json:"unsupported"`
	}
	switch {
	case runErr == nil && res != nil:
		if err := json.Unmarshal(stdout.Bytes(), res); err != nil {
			return fmt.Errorf("cuda-checkpoint %s: unreadable answer %q: %w", action, stdout.Bytes(), err)
		}
		return nil
	case runErr == nil:
		return nil
	case json.Unmarshal(stdout.Bytes(), &failure) == nil && failure.Error != "":
		err := fmt.Errorf("cuda-checkpoint %s: %s", action, failure.Error)
		if failure.Unsupported {
			err = fmt.Errorf("%w: %w", backend.ErrParkUnsupported, err)
		}
		return err
	default:
		return fmt.Errorf("cuda-checkpoint %s: %s", action, helperMessage(append(stdout.Bytes(), stderr.Bytes()...), runErr))
	}
}

// helperMessage is what the helper said, or how it failed when it said
// nothing: its first line without the "inferd: " every error of the
// command line starts with.
func helperMessage(out []byte, err error) string {
	line, _, _ := strings.Cut(strings.TrimSpace(string(out)), "\n")
	if line = strings.TrimPrefix(line, "inferd: "); line != "" {
		return line
	}
	return err.Error()
}

func pidArgs(pids []int) []string {
	s := make([]string, len(pids))
	for i, pid := range pids {
		s[i] = strconv.Itoa(pid)
	}
	return s
}
