package cli

import (
	"context"
	"fmt"
	"sync"

	"github.com/rs/zerolog"

	"inferd/config"
	"inferd/gpu"
	"inferd/scheduler"
	"inferd/scheduler/backend/local"
	"inferd/store"
)

// machineCheck checks models against this machine as serve would run them
// with cfg: the model user resolved from replica.user as serve resolves it
// (so INFERD_REPLICA_USER, which make run sets, counts), and the GPUs the
// gpu.* settings give. It is what apply runs with no daemon (the daemon
// checks with its own backend) and what doctor runs on every applied
// project. The GPUs are read on the first check; close releases them.
type machineCheck struct {
	cfg config.Config

	once    sync.Once
	checker *local.Checker
	userErr error
	gpus    *gpu.Inventory
}

func newMachineCheck(cfg config.Config) *machineCheck { return &machineCheck{cfg: cfg} }

func (m *machineCheck) init() {
	m.once.Do(func() {
		m.gpus = gpu.Open(m.cfg.GPU.Simulate, m.cfg.GPU.Disabled, zerolog.Nop())
		runAs, err := local.ModelUser(m.cfg.Replica.User)
		m.checker = &local.Checker{RunAs: runAs, Devices: m.gpus.Devices, Parking: local.ParkSupportOf(m.gpus)}
		if err != nil {
			m.userErr = fmt.Errorf("replica.user: %w: serve will refuse to start; create the user or set replica.user", err)
		}
	})
}

// Check is a local.Checker's Check; a model user that does not exist is a
// finding of its own.
func (m *machineCheck) Check(spec store.ModelSpec) []local.Finding {
	m.init()
	var out []local.Finding
	if m.userErr != nil {
		out = append(out, local.Finding{Fatal: true, Text: m.userErr.Error()})
	}
	return append(out, m.checker.Check(spec)...)
}

// Problems is Check split as httpapi.ModelCheck wants it.
func (m *machineCheck) Problems(spec store.ModelSpec) (problems, warnings []string) {
	return local.SplitFindings(m.Check(spec))
}

// CUDA asks p's Python whether it sees CUDA (see cudaCheck), with this
// machine's GPUs and as the model user.
func (m *machineCheck) CUDA(ctx context.Context, p store.Project) (status, text string) {
	m.init()
	if m.userErr != nil {
		return "warn", "CUDA check skipped: no model user to run it as"
	}
	return cudaCheck(ctx, p, m.gpus.Devices(), m.checker.RunAs, m.cfg.Replica.PassEnv)
}

// CapacityWarnings says which projects' minReplicas, or which projects
// beside the others' minimums, cannot run on this machine's GPUs and CPU
// slots as serve would have them (scheduler.MinimumsWarnings).
func (m *machineCheck) CapacityWarnings(projects []store.Project) []string {
	m.init()
	return scheduler.MinimumsWarnings(m.gpus.Devices(), local.CPUSlots(m.cfg.CPUSlots), projects)
}

func (m *machineCheck) close() {
	if m.gpus != nil {
		m.gpus.Close()
	}
}
