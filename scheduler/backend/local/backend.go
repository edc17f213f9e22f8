package local

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"runtime"
	"time"

	"github.com/rs/zerolog"

	"inferd/gpu"
	"inferd/image"
	"inferd/pyenv"
	"inferd/scheduler/backend"
)

// Defaults of a Config's zero values.
const (
	DefaultLogMaxBytes           = 10 << 20
	DefaultLogKeep               = 3
	DefaultLogMaxBytesPerProject = 100 << 20
	DefaultStopGrace             = 10 * time.Second
)

// Config sets up the local-process backend. Zero values take the defaults
// named per field.
type Config struct {
	// LogDir holds the replica logs, LogDir/<team>/<project>/<replica>.log;
	// "" = none are kept (only each replica's last line, in memory).
	LogDir      string
	LogMaxBytes int64 // a log is rotated beyond this; default 10 MiB
	LogKeep     int   // rotated generations kept per log; default 3
	// LogMaxBytesPerProject bounds all of a project's logs together, across
	// replicas and restarts (see logbudget.go); default 100 MiB.
	LogMaxBytesPerProject int64
	// RunDir holds a pid file per running replica, which Recover reads after
	// a crash of the daemon; "" = none are written. It also names this
	// backend's cgroups, so that a restarted daemon finds its predecessor's.
	RunDir string
	// User is replica.user, who model processes run as when inferd may
	// switch users (root, or CAP_SETUID, CAP_SETGID and CAP_CHOWN): "" or
	// PerProject = a uid of each project's own from UIDFirst-UIDLast; a user
	// name or uid = that user for all; "root" = inferd's own user. Without
	// the privilege models run as inferd's own user whatever it says.
	User string
	// UIDFirst and UIDLast bound the per-project uids; zero = the defaults
	// (DefaultUIDFirst-DefaultUIDLast).
	UIDFirst, UIDLast uint32
	// UIDFile keeps which uid each project was given, for good; "" = in
	// memory only (a test).
	UIDFile string
	// ReadOnlyUIDs reads UIDFile but records no new assignment (doctor,
	// beside a running daemon, which owns the file).
	ReadOnlyUIDs bool
	// Network is the default of a project's network: store.NetworkPrivate
	// ("" = it) or store.NetworkHost.
	Network string
	// NoCgroups turns off the cgroup per replica (replica.cgroups: false).
	NoCgroups bool
	// DevDir is where the device nodes are, for the device rules of
	// replicas (devices.go); "" = /dev. Tests point it at nodes of their own.
	DevDir    string
	StopGrace time.Duration // SIGTERM to SIGKILL when stopping a replica; default 10 s
	CPUSlots  int           // CPU replicas (gpus: 0) at once; default runtime.NumCPU()
	GPUs      Inventory     // the machine's GPUs; nil = none
	// DriverRoot is the root under which the GPU driver's libraries and
	// tools are found for replicas in images (driverfiles.go); "" = /.
	// Tests point it at a fake driver.
	DriverRoot string
	// PythonDir holds the projects' Python environments (package pyenv),
	// built from PythonIndex where a project has no wheelhouse; "" = none:
	// a project with python: fails to start.
	PythonDir, PythonIndex string
	// ImageDir holds the images projects run in (package image); "" =
	// none: a project with an image fails to start.
	ImageDir string
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
	cfg     Config
	sb      *sandbox
	log     zerolog.Logger
	ports   *ports
	budgets *logBudgets
	// files says whether the logs and pid files are closed to other
	// users (privatefiles.go), as New found and left them.
	files backend.Protection
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
	// ckpt parks replicas' CUDA processes (parking.go).
	ckpt checkpointTool
	// images are the images projects run in (imagerun.go); nil = none.
	images *image.Store
	// pyenvs builds the projects' Python environments (pythonenv.go);
	// nil = none.
	pyenvs *pyenv.Builder
}

var _ backend.Backend = (*Backend)(nil)

// CPUSlots is how many CPU replicas a backend configured with cpuSlots n
// runs at once: n, or one per CPU for 0.
func CPUSlots(n int) int {
	if n <= 0 {
		return runtime.NumCPU()
	}
	return n
}

// New returns the local-process backend, with the sandbox cfg asks for as
// far as this machine and the daemon's privileges allow (see Protections).
// It fails when cfg.User must be used and cannot be: serve then refuses to
// start rather than run models as root. It starts nothing, but makes the
// directories the sandbox needs (Close removes them).

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
	cfg.CPUSlots = CPUSlots(cfg.CPUSlots)
	if cfg.LogMaxBytesPerProject <= 0 {
		cfg.LogMaxBytesPerProject = DefaultLogMaxBytesPerProject
	}
	sb, err := newSandbox(cfg)
	if err != nil {
		return nil, err
	}
	b := &Backend{
		cfg:            cfg,
		sb:             sb,
		log:            log,
		ports:          newPorts(),
		budgets:        newLogBudgets(cfg.LogMaxBytesPerProject),
		readyIntervals: defaultReadyIntervals,
		listening:      groupListeningPorts,
		ckpt:           checkpointToolFor(cfg),
		files:          privateFiles(true, cfg.LogDir, cfg.RunDir),
	}
	if cfg.ImageDir != "" {
		if b.images, err = image.Open(cfg.ImageDir); err != nil {
			return nil, err
		}
	}
	if cfg.PythonDir != "" {
		if b.pyenvs, err = pyenv.New(cfg.PythonDir, cfg.PythonIndex); err != nil {
			return nil, err
		}
	}
	logProtections(log, b.Protections())
	return b, nil
}

// Close removes the directories New made for the sandbox, where they are
// empty: call it once every replica has exited.
func (b *Backend) Close() {
	if b.sb.cgroups != nil {
		b.sb.cgroups.close()
	}
	os.Remove(b.sb.dirs.base)
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

// Recover kills what replicas a previous daemon left running: every
// process in the cgroups of this backend's instance (see cgroup.go), and
// the process groups its pid files in RunDir record (see killOrphans), for
// replicas that had no cgroup. It waits for them to be gone, so that the
// GPU memory they held comes free before new replicas are placed, and
// removes the private directories they left.
func (b *Backend) Recover(ctx context.Context) error {
	var errs []error
	if cg := b.sb.cgroups; cg != nil {
		n, err := cg.recover()
		if n > 0 {
			b.log.Warn().Int("killed", n).Msg("killed the cgroups of replicas left by a previous run")
		}
		errs = append(errs, err)
	}
	if b.cfg.RunDir != "" {
		n, err := killOrphans(b.cfg.RunDir, b.log)
		if n > 0 {
			b.log.Warn().Int("killed", n).Msg("killed model processes left by a previous run")
		}
		errs = append(errs, err)
	}
	errs = append(errs, b.sb.dirs.clear())
	return errors.Join(errs...)
}

// LookPath finds a model's program on the daemon's PATH, as Launch will for a
// command whose program has no slash.
func LookPath(program string) (string, error) { return exec.LookPath(program) }
