package local

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/rs/zerolog"

	"inferd/gpu"
	"inferd/scheduler/backend"
)

// Defaults of a Config's zero values.
const (
	DefaultLogMaxBytes = 10 << 20
	DefaultLogKeep     = 3
	DefaultStopGrace   = 10 * time.Second
)

// Config sets up the local-process backend. Zero values take the defaults
// named per field.
type Config struct {
	// LogDir holds the replica logs, LogDir/<team>/<project>/<replica>.log;
	// "" = none are kept (only each replica's last line, in memory).
	LogDir      string
	LogMaxBytes int64 // a log is rotated beyond this; default 10 MiB
	LogKeep     int   // rotated generations kept per log; default 3
	// RunDir holds a pid file per running replica, which Recover reads after
	// a crash of the daemon; "" = none are written.
	RunDir string
	// User is replica.user: the user model processes run as when inferd
	// runs as root ("root", or "", keeps them as root). Ignored when inferd
	// does not run as root: models then run as inferd's own user.
	User      string
	StopGrace time.Duration // SIGTERM to SIGKILL when stopping a replica; default 10 s
	CPUSlots  int           // CPU replicas (gpus: 0) at once; default runtime.NumCPU()
	GPUs      Inventory     // the machine's GPUs; nil = none
	// PassEnv is replica.passEnv: variables copied from inferd's
	// environment to every model, beside the fixed allowlist (CUDA may
	// need LD_LIBRARY_PATH).
	PassEnv []string
}

// Inventory says which GPUs the machine has (*gpu.Inventory is one).
type Inventory interface {
	Devices() []gpu.Device
}

// Backend runs each replica as a process group on this machine. Create it
// with New. Its methods are safe for concurrent use.
type Backend struct {
	cfg   Config
	runAs *RunAs // nil = inferd's own user
	log   zerolog.Logger
	ports *ports
	// readyIntervals are the pauses between a booting model's health
	// checks (see pollReady); a field so a test can leave only the output
	// as a trigger.
	readyIntervals []time.Duration
	// maxReplyBytes caps a model's reply (0 = the protocol's 64 MiB); a
	// field so a test can lower it.
	maxReplyBytes int64
	// listening reads the TCP ports a replica's process group listens on
	// (groupListeningPorts), to explain a model that answers on none of
	// ours; a field so a test can fake it.
	listening func(pgid int) ([]int, error)
}

var _ backend.Backend = (*Backend)(nil)

// New returns the local-process backend. It fails when cfg.User must be used
// (inferd runs as root) and cannot be: serve then refuses to start rather
// than run models as root. It starts nothing.
func New(cfg Config, log zerolog.Logger) (*Backend, error) {
	if cfg.LogMaxBytes <= 0 {
		cfg.LogMaxBytes = DefaultLogMaxBytes
	}
	if cfg.LogKeep <= 0 {
		cfg.LogKeep = DefaultLogKeep
	}
	if cfg.StopGrace <= 0 {
		cfg.StopGrace = DefaultStopGrace
	}
	if cfg.CPUSlots <= 0 {
		cfg.CPUSlots = runtime.NumCPU()
	}
	runAs, err := ModelUser(cfg.User)
	if err != nil {
		return nil, fmt.Errorf("config: replica.user: %w", err)
	}
	switch {
	case runAs != nil:
		log.Info().Str("user", runAs.Name).Uint32("uid", runAs.UID).Msg("model processes run as an unprivileged user")
	case os.Geteuid() == 0:
		log.Warn().Msg("model processes run as root (replica.user: root)")
	}
	return &Backend{
		cfg:            cfg,
		runAs:          runAs,
		log:            log,
		ports:          newPorts(),
		readyIntervals: defaultReadyIntervals,
		listening:      groupListeningPorts,
	}, nil
}

// ModelUser is the user model processes run as given replica.user: that user
// when inferd runs as root (unless it is "", "root" or "0"), else inferd's
// own (nil).
func ModelUser(name string) (*RunAs, error) {
	if os.Geteuid() != 0 || name == "" || name == "root" || name == "0" {
		return nil, nil
	}
	return LookupRunAs(name)
}

// Launch starts a replica as a process group; see Backend.Launch.
func (b *Backend) Launch(spec backend.Spec) (backend.Instance, error) {
	p, err := b.start(spec)
	if err != nil {
		// A nil *Process in a non-nil Instance would hide the failure.
		return nil, err
	}
	return p, nil
}

// Capacity is the configured CPU slots and the machine's GPUs.
func (b *Backend) Capacity() backend.Capacity {
	c := backend.Capacity{CPUSlots: b.cfg.CPUSlots}
	if b.cfg.GPUs != nil {
		c.GPUs = b.cfg.GPUs.Devices()
	}
	return c
}

// RefreshGPUs asks the GPU inventory for a fresh read of the devices, when
// it can take one (*gpu.Inventory can): the scheduler calls it when a
// replica on a real GPU has exited, so that its memory shows back at once.
func (b *Backend) RefreshGPUs() {
	if r, ok := b.cfg.GPUs.(interface{ RefreshSoon() }); ok {
		r.RefreshSoon()
	}
}

// ProcessGroup tells which replica a process the GPU driver lists belongs
// to: each replica leads its own process group, whose id is its Info().Pid.
func (b *Backend) ProcessGroup(pid int) (int, bool) { return ProcessGroup(pid) }

// Recover kills the process groups of replicas that a previous daemon left
// running, as its pid files in RunDir record them (see killOrphans), and
// waits briefly for them to be gone, so that the GPU memory they held comes
// free before new replicas are placed.
func (b *Backend) Recover(ctx context.Context) error {
	if b.cfg.RunDir == "" {
		return nil
	}
	n, err := killOrphans(b.cfg.RunDir, b.log)
	if n > 0 {
		b.log.Warn().Int("killed", n).Msg("killed model processes left by a previous run")
	}
	return err
}

// LookPath finds a model's program on the daemon's PATH, as Launch will for a
// command whose program has no slash.
func LookPath(program string) (string, error) { return exec.LookPath(program) }
