package scheduler

import (
	"github.com/rs/zerolog"

	replica "inferd/scheduler/backend/local"
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
