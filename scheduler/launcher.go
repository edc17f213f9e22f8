package scheduler

import (
	"github.com/rs/zerolog"

	"inferd/scheduler/replica"
)

// ProcessLauncher returns the Launcher that runs model servers as OS
// processes through replica.Start.
func ProcessLauncher(log zerolog.Logger) Launcher { return processLauncher{log: log} }

type processLauncher struct{ log zerolog.Logger }

func (l processLauncher) Launch(spec replica.Spec) (Instance, error) {
	p, err := replica.Start(spec, l.log)
	if err != nil {
		// A nil *Process in a non-nil Instance would hide the failure.
		return nil, err
	}
	return p, nil
}

// ProcessGroup tells the scheduler which replica a process the GPU driver
// lists belongs to: each replica leads its own process group.
func (l processLauncher) ProcessGroup(pid int) (int, bool) { return replica.ProcessGroup(pid) }
