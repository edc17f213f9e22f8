package backend

import (
	"context"
	"errors"
)

// Checkpointer is a backend that can park a replica: move its GPU state to
// host memory and freeze it, so that its GPUs are free for other replicas
// while it keeps its loaded model, and later restore it onto the same GPUs,
// much faster than a cold boot. The local backend does it through the CUDA
// driver's checkpoint API (driver 570 or later); see docs/gpu.md
// "Parking". The scheduler decides when (its parkTimeout) and never sends
// a parked replica a call.
type Checkpointer interface {
	// ParkSupport says whether replicas can be parked on this machine:
	// nil, or why not (no NVIDIA driver, a driver without the checkpoint
	// API, a build without cgo). It may take a moment (it asks the
	// driver): apply and doctor call it, never the scheduler's loop.
	ParkSupport() error

	// Park checkpoints inst's GPU state into host memory (the process's
	// own: its memory limit still counts it) and freezes the replica.
	// Once it returns nil the replica uses no GPU memory and runs nothing
	// until Restore. An error wrapping ErrParkUnsupported means nothing
	// was done: the replica is as it was, ready. Any other error leaves it
	// in a state nobody can vouch for: the caller stops it. ctx bounds the
	// wait.
	Park(ctx context.Context, inst Instance) (ParkReport, error)

	// Restore thaws a parked inst and brings its GPU state back onto the
	// GPUs it was pinned to, which must be free for it. Once it returns nil
	// the replica takes calls again; on an error the caller stops it.
	Restore(ctx context.Context, inst Instance) error
}

// ErrParkUnsupported is wrapped by Park's error when this machine cannot
// park replicas at all (see ParkSupport): nothing was done.
var ErrParkUnsupported = errors.New("replicas cannot be parked here")

// ParkReport says what one Park did, for the log.
type ParkReport struct {
	// CUDAProcesses counts the replica's processes that had a CUDA
	// context and were checkpointed (0: none used the GPU, so the
	// replica was only frozen).
	CUDAProcesses int
}
