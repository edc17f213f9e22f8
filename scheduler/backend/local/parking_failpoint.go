//go:build failpoints

package local

import (
	"context"
	"errors"
	"fmt"
	"os"

	"inferd/scheduler/backend"
)

// In test builds (-tags failpoints, like store/bolt/failpoint.go),
// INFERD_FAKE_CHECKPOINT replaces the CUDA driver with a fake, so that an
// end-to-end test on simulated GPUs parks and restores replicas through
// everything else that is real (the scheduler, the freezing, the status):
//
//	ok            parks and restores (no CUDA process is checkpointed)
//	unsupported   the box cannot park (ParkSupport and Park say so)
//	fail-park     every park fails
//	fail-restore  every restore fails
//
// Production builds never read it.
func checkpointToolFor(cfg Config) checkpointTool {
	switch mode := os.Getenv("INFERD_FAKE_CHECKPOINT"); mode {
	case "":
		return newHelperTool(cfg.GPUs)
	case "ok", "unsupported", "fail-park", "fail-restore":
		return fakeTool(mode)
	default:
		panic(fmt.Sprintf("INFERD_FAKE_CHECKPOINT=%q: want ok, unsupported, fail-park or fail-restore", mode))
	}
}

// fakeTool is the checkpoint tool of INFERD_FAKE_CHECKPOINT.
type fakeTool string

var errFakeUnsupported = errors.New("INFERD_FAKE_CHECKPOINT=unsupported: no checkpoint API")

func (f fakeTool) support() error {
	if f == "unsupported" {
		return errFakeUnsupported
	}
	return nil
}

func (f fakeTool) park(context.Context, []int, []int) ([]int, error) {
	switch f {
	case "unsupported":
		return nil, fmt.Errorf("%w: %w", backend.ErrParkUnsupported, errFakeUnsupported)
	case "fail-park":
		return nil, errors.New("INFERD_FAKE_CHECKPOINT=fail-park: cuCheckpointProcessLock: CUDA_ERROR_TIMEOUT")
	}
	return nil, nil
}

func (f fakeTool) restore(context.Context, []int) error {
	if f == "fail-restore" {
		return errors.New("INFERD_FAKE_CHECKPOINT=fail-restore: cuCheckpointProcessRestore: CUDA_ERROR_OUT_OF_MEMORY")
	}
	return nil
}
