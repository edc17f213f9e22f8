// Package cudackpt calls the CUDA driver's checkpoint API for another
// process: cuCheckpointProcessLock, Checkpoint, Restore and Unlock (driver
// 570 or later, CUDA 12.8), which move a running CUDA process's GPU memory
// into its host memory, release the GPU, and bring it back. inferd parks idle
// GPU replicas with it (docs/gpu.md "Parking").
//
// The driver's library, libcuda.so.1, is loaded with dlopen when Open is
// called, never at start-up: the binary runs where there is no driver, and a
// driver too old for the API is an error that names what is missing, never
// a crash (a missing symbol is looked up, not called). The daemon itself
// never calls it: it runs `inferd cuda-checkpoint` (package cli) in a
// process of its own, so that the driver's state and any fault stay out of
// the daemon. A build without cgo has an Open that says so.
package cudackpt

import (
	"errors"
	"fmt"
	"slices"
)

// State is a CUDA process's checkpoint state (CUprocessState).
type State int

// The states the driver reports.
const (
	Running      State = 0 // the default: CUDA calls run
	Locked       State = 1 // CUDA calls block; ready to checkpoint
	Checkpointed State = 2 // its GPU memory is in host memory, the GPU released
	Failed       State = 3 // the checkpoint or restore failed beyond repair
)

func (s State) String() string {
	switch s {
	case Running:
		return "running"
	case Locked:
		return "locked"
	case Checkpointed:
		return "checkpointed"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("state(%d)", int(s))
}

// ErrUnsupported is wrapped by Open's error when this machine cannot
// checkpoint at all: no driver library, a driver without the checkpoint API,
// or a build without cgo.
var ErrUnsupported = errors.New("the CUDA checkpoint API is not available")

// Error is a failed driver call: which, on which process, and the driver's
// CUresult by name.
type Error struct {
	Call string // e.g. "cuCheckpointProcessLock"
	Pid  int    // 0 for calls about no process
	Code int    // the CUresult
	Name string // e.g. "CUDA_ERROR_NOT_SUPPORTED"
}

func (e *Error) Error() string {
	if e.Pid == 0 {
		return fmt.Sprintf("%s: %s (%d)", e.Call, e.Name, e.Code)
	}
	return fmt.Sprintf("%s(pid %d): %s (%d)", e.Call, e.Pid, e.Name, e.Code)
}

// cudaErrorNotSupported is CUDA_ERROR_NOT_SUPPORTED.
const cudaErrorNotSupported = 801

// Unsupported reports whether err says the driver does not support the
// call here (CUDA_ERROR_NOT_SUPPORTED), rather than that it failed.
func Unsupported(err error) bool {
	var e *Error
	return errors.Is(err, ErrUnsupported) || errors.As(err, &e) && e.Code == cudaErrorNotSupported
}

// api is the driver's checkpoint calls; *Driver is the real one, tests pass
// fakes to Park and Restore.
type api interface {
	State(pid int) (State, error)
	Lock(pid int, timeoutMs uint32) error
	Checkpoint(pid int) error
	Restore(pid int) error
	Unlock(pid int) error
}

// ParkResult is what Park did.
type ParkResult struct {
	// Checkpointed are the processes whose GPU memory is now in host
	// memory (Restore them).
	Checkpointed []int `json:"checkpointed"`
	// Skipped are the processes the driver knows no CUDA state of, with
	// its answer: they use no GPU.
	Skipped map[int]string `json:"skipped,omitempty"`
}

// Park checkpoints every CUDA process among pids: all are locked (waiting
// up to timeoutMs each for calls in flight to end), then checkpointed. A
// process whose state the driver cannot tell is skipped as not using CUDA,
// unless it is in mustPids (the processes NVML lists on the GPU): those
// must be checkpointed. On any failure what was done is undone (restored,
// unlocked) and the first error returned, so the processes run as before.
func Park(d api, pids, mustPids []int, timeoutMs uint32) (ParkResult, error) {
	res := ParkResult{Skipped: map[int]string{}}
	var cuda []int
	for _, pid := range pids {
		st, err := d.State(pid)
		switch {
		case err != nil && Unsupported(err):
			return ParkResult{}, err
		case err != nil && slices.Contains(mustPids, pid):
			return ParkResult{}, fmt.Errorf("process %d uses the GPU but the driver cannot checkpoint it: %w", pid, err)
		case err != nil:
			res.Skipped[pid] = err.Error()
		case st != Running:
			return ParkResult{}, fmt.Errorf("process %d is %s, not running: another checkpoint is under way, or one left it so", pid, st)
		default:
			cuda = append(cuda, pid)
		}
	}
	var locked, done []int
	undo := func(err error) (ParkResult, error) {
		for _, pid := range done {
			d.Restore(pid) // best effort: the first error is the one to tell
		}
		for _, pid := range locked {
			d.Unlock(pid)
		}
		return ParkResult{}, err
	}
	for _, pid := range cuda {
		if err := d.Lock(pid, timeoutMs); err != nil {
			return undo(err)
		}
		locked = append(locked, pid)
	}
	for _, pid := range cuda {
		if err := d.Checkpoint(pid); err != nil {
			return undo(err)
		}
		done = append(done, pid)
	}
	res.Checkpointed = cuda
	return res, nil
}

// Restore brings back each of pids that Park checkpointed: its GPU state
// restored, then unlocked. A process already running is left alone; one
// left locked (a restore that got halfway) is unlocked.
func Restore(d api, pids []int) error {
	var errs []error
	for _, pid := range pids {
		st, err := d.State(pid)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if st == Checkpointed {
			if err := d.Restore(pid); err != nil {
				errs = append(errs, err)
				continue
			}
			st = Locked
		}
		if st == Locked {
			if err := d.Unlock(pid); err != nil {
				errs = append(errs, err)
				continue
			}
			st = Running
		}
		if st != Running {
			errs = append(errs, fmt.Errorf("process %d is %s after restore", pid, st))
		}
	}
	return errors.Join(errs...)
}
