package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"inferd/config"
	"inferd/gpu"
	"inferd/manifest"
	"inferd/scheduler/backend"
	"inferd/scheduler/backend/local"
	"inferd/store"
	"inferd/store/bolt"
)

// doctorCommand checks what inferd needs on this box and says what to fix,
// one line per check. It loads the config itself, so that a broken config is
// reported as a check, and it never creates the data directory or file.
type doctorCommand struct {
	env *env
}

func (c *doctorCommand) Usage() string {
	return `Usage:
  inferd [global flags] doctor

Checks what inferd needs on this box and prints one line per check (ok, warn
or fail) with what to fix: the config, the data directory and file, free disk,
the NVIDIA driver, the replica sandbox (the user models run as, their
cgroup, memory and pids limits, network, private dirs and GPU device nodes: which protections
this user's privileges give, so run it as the service runs), python3 and
that the example model boots in that sandbox, the listen address, and every
applied project (its dir and program exist and the model user may read and
run them; its GPUs fit; for a GPU project, whether its Python's torch sees
CUDA). Exit status 1 when a check fails. Give it the same
--config and environment as serve (make doctor does, for make run's
INFERD_REPLICA_USER).
`
}

// doctorReport prints one line per check and counts failures.
type doctorReport struct {
	out   io.Writer
	fails int
}

func (r *doctorReport) line(status, check, format string, a ...any) {
	if status == "fail" {
		r.fails++
	}
	fmt.Fprintf(r.out, "%-4s  %-*s %s\n", status, doctorCheckWidth, check, fmt.Sprintf(format, a...))
}

// doctorCheckWidth is the width of the check names' column: the longest
// name ("process tree", "memory limit", "private dirs"), so that the
// findings line up.
const doctorCheckWidth = 12

func (c *doctorCommand) Run(ctx context.Context, args []string) error {
	if err := parseFlagsOnly(subFlags("doctor"), args); err != nil {
		return err
	}
	r := &doctorReport{out: c.env.stdout}
	cfg, err := c.env.config()
	if err != nil {
		r.line("fail", "config", "%v: fix the file or the INFERD_* environment", err)
		return fmt.Errorf("doctor: %d check(s) failed", r.fails)
	}
	if c.env.configPath != "" {
		r.line("ok", "config", "loaded %s", c.env.configPath)
	} else {
		r.line("ok", "config", "no config file: built-in defaults (pass --config or set INFERD_CONFIG)")
	}

	running := daemonAnswers(cfg)
	doctorDataDir(r, cfg)
	doctorDataFile(r, cfg, running)
	doctorDisk(r, cfg)
	doctorImages(r, cfg)
	doctorGPU(r, cfg)
	if b, ok := doctorSandbox(r, cfg); ok {
		doctorExample(r, b)
		b.Close()
	}
	doctorListen(r, cfg, running)
	doctorProjects(ctx, r, cfg, running)

	if r.fails > 0 {
		return fmt.Errorf("doctor: %d check(s) failed", r.fails)
	}
	return nil
}

func doctorDataDir(r *doctorReport, cfg config.Config) {
	fi, err := os.Stat(cfg.DataDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
		r.line("warn", "data dir", "%s does not exist yet: inferd creates it on first start (its parent must be writable)", cfg.DataDir)
		return
	case err != nil:
		r.line("fail", "data dir", "%v", err)
		return
	case !fi.IsDir():
		r.line("fail", "data dir", "%s is not a directory: point dataDir elsewhere", cfg.DataDir)
		return
	}
	f, err := os.CreateTemp(cfg.DataDir, ".doctor-*")
	if err != nil {
		r.line("fail", "data dir", "%s is not writable by this user (%v): fix its owner or mode", cfg.DataDir, err)
		return
	}
	f.Close()
	os.Remove(f.Name())
	if fi.Mode().Perm()&0o077 != 0 {
		r.line("warn", "data dir", "%s is writable but has mode %o, open to other users: inferd makes it 700 when it starts (it holds key hashes and every team's logs)", cfg.DataDir, fi.Mode().Perm())
		return
	}
	r.line("ok", "data dir", "%s exists and is writable", cfg.DataDir)
}

func doctorDataFile(r *doctorReport, cfg config.Config, running bool) {
	path := cfg.StorePath()
	if cfg.Cluster != nil {
		r.line("ok", "data file", "cluster mode (node %s): the records are in etcd, not in %s; doctor does not check etcd yet", cfg.Cluster.Name, path)
		return
	}
	if running {
		r.line("ok", "data file", "%s: daemon running (admin socket answers)", path)
		return
	}
	fi, err := os.Stat(path)
	if errors.Is(err, os.ErrNotExist) {
		r.line("ok", "data file", "%s does not exist yet: it is created on first start", path)
		return
	}
	if err != nil {
		r.line("fail", "data file", "%v", err)
		return
	}
	sum, err := storeSummary(path)
	switch {
	case errors.Is(err, bolt.ErrInUse):
		r.line("warn", "data file", "%s is locked by another process but no daemon answers on %s", path, cfg.SocketPath())
	case err != nil:
		r.line("fail", "data file", "%v", err)
	case sum.schema < bolt.SchemaVersion:
		r.line("ok", "data file", "%s opens (%d bytes, %d teams, %d projects); schema version %d: the next start migrates it to %d and keeps a copy as %s.schema-v%d",
			path, fi.Size(), sum.teams, sum.projects, sum.schema, bolt.SchemaVersion, path, sum.schema)
	default:
		r.line("ok", "data file", "%s opens (%d bytes, %d teams, %d projects, schema version %d)", path, fi.Size(), sum.teams, sum.projects, sum.schema)
	}
}

func doctorDisk(r *doctorReport, cfg config.Config) {
	// Measure the data dir, or the nearest existing parent if it does not exist yet.
	dir := cfg.DataDir
	for {
		if _, err := os.Stat(dir); err == nil {
			break
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			break
		}
		dir = parent
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		r.line("warn", "disk", "cannot measure free space in %s: %v", dir, err)
		return
	}
	free := st.Bavail * uint64(st.Bsize)
	const gib = 1 << 30
	if free < gib {
		r.line("warn", "disk", "%s has only %s free: call records stop being written when the disk fills", dir, humanBytes(free))
		return
	}
	r.line("ok", "disk", "%s free in %s", humanBytes(free), dir)
}

func humanBytes(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := uint64(unit), 0
	for m := n / unit; m >= unit; m /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}

func doctorGPU(r *doctorReport, cfg config.Config) {
	switch {
	case len(cfg.GPU.Simulate) > 0:
		r.line("warn", "gpu", "%d simulated GPU(s) from gpu.simulate: the NVIDIA driver is not used; remove gpu.simulate to serve on real GPUs", len(cfg.GPU.Simulate))
		return
	case cfg.GPU.Disabled:
		r.line("warn", "gpu", "gpu.disabled is set: the NVIDIA driver is not checked and every project runs on CPU")
		return
	}
	var buf bytes.Buffer
	inv := gpu.Discover(zerolog.New(&buf))
	defer inv.Close()
	if n := inv.Count(); n > 0 {
		r.line("ok", "gpu", "%d NVIDIA GPU(s) via %s", n, inv.Source())
		doctorParking(r, inv)
		return
	}
	detail := ""
	var entry struct {
		Message string `json:"message"`
		NVML    string `json:"nvml"`
		Error   string `json:"error"`
	}
	if line, _, _ := strings.Cut(buf.String(), "\n"); json.Unmarshal([]byte(line), &entry) == nil {
		switch cause := entry.NVML + entry.Error; {
		case cause != "" && strings.HasPrefix(entry.Message, "no NVIDIA driver"):
			detail = " (NVML: " + cause + ")"
		case cause != "":
			detail = " (" + entry.Message + ": " + cause + ")"
		case entry.Message != "":
			detail = " (" + entry.Message + ")"
		}
	}
	r.line("warn", "gpu", "no NVIDIA driver: CPU only%s; install the NVIDIA driver to serve GPU models", detail)
}

// doctorParking says whether idle GPU replicas can be parked here (a
// project's parkTimeout; docs/gpu.md "Parking"): the CUDA driver's
// checkpoint API, asked through inferd cuda-checkpoint as serve asks it.
// Without it parking is only a warning for the projects that set
// parkTimeout (doctor's project checks say which).
func doctorParking(r *doctorReport, gpus local.Inventory) {
	if err := local.ParkSupportOf(gpus)(); err != nil {
		r.line("ok", "parking", "not available (%v): projects with parkTimeout keep idle replicas warm until idleTimeout; driver 570 or later parks them", err)
		return
	}
	r.line("ok", "parking", "the CUDA driver's checkpoint API is there: projects with parkTimeout park idle GPU replicas in host memory")
}

func doctorListen(r *doctorReport, cfg config.Config, running bool) {
	ln, err := ListenAPI(cfg.Listen)
	if err == nil {
		ln.Close()
		r.line("ok", "listen", "%s is free", cfg.Listen)
		return
	}
	if running {
		r.line("ok", "listen", "%s is in use by the running daemon", cfg.Listen)
		return
	}
	r.line("fail", "listen", "%v", err)
}

// exampleBootTimeout bounds how long doctor waits for the example model.
const exampleBootTimeout = 15 * time.Second

// exampleManifests are where the example manifest (its echo project)
// lives: beside the installed binary (/usr/bin/inferd →
// /usr/share/inferd/examples/projects.yaml, as packaged) or in a source
// checkout.
func exampleManifests() []string {
	var paths []string
	if exe, err := os.Executable(); err == nil {
		paths = append(paths, filepath.Join(filepath.Dir(exe), "..", "share", "inferd", "examples", "projects.yaml"))
	}
	return append(paths, filepath.Join("examples", "projects.yaml"))
}

// exampleModel is the echo project's model as the example manifest
// describes it (its program, dir and env), so that doctor boots it as
// make run and an apply of the example would; ok is false when no
// example is installed.
func exampleModel() (m store.ModelSpec, where string, ok bool, err error) {
	for _, path := range exampleManifests() {
		data, rerr := os.ReadFile(path)
		if rerr != nil {
			continue
		}
		abs, _ := filepath.Abs(path)
		projects, perr := manifest.Parse(data, filepath.Dir(abs))
		if perr != nil {
			return m, path, false, perr
		}
		for _, p := range projects {
			if p.ID == "echo" {
				return p.Model, path, true, nil
			}
		}
		return m, path, false, fmt.Errorf("%s has no echo project", path)
	}
	return m, strings.Join(exampleManifests(), ", "), false, nil
}

// doctorSandbox reports the protections replicas get under cfg, on this
// machine and as this user (run doctor as the service runs, as root or with
// the unit's capabilities, to see the service's): one line each, warn for
// those off. It returns a backend set up like serve's, for the example
// check, without touching the daemon's cgroups or uid assignments: its
// cgroups have a name of their own, and the uids it reads are not added to.
func doctorSandbox(r *doctorReport, cfg config.Config) (*local.Backend, bool) {
	bc := BackendConfig(cfg, nil)
	bc.LogDir, bc.RunDir, bc.ReadOnlyUIDs = "", "", true
	bc.ImageDir, bc.PythonDir = "", "" // doctor reads the images itself; its backend imports and builds nothing
	bc.StopGrace = time.Second
	b, err := local.New(bc, zerolog.Nop())
	if err != nil {
		r.line("fail", "model user", "%v: serve will refuse to start; fix replica.user", err)
		return nil, false
	}
	labels := map[string]string{
		backend.ProtectionIdentity:       "model user",
		backend.ProtectionProcessTree:    "process tree",
		backend.ProtectionMemoryLimit:    "memory limit",
		backend.ProtectionPidsLimit:      "pids limit",
		backend.ProtectionNetwork:        "network",
		backend.ProtectionPrivateDirs:    "private dirs",
		backend.ProtectionDevices:        "devices",
		backend.ProtectionPIDNamespace:   "pid ns",
		backend.ProtectionPrivateTmp:     "private tmp",
		backend.ProtectionUserNamespaces: "user ns",
		backend.ProtectionPrivateFiles:   "file modes",
	}
	for _, p := range b.Protections() {
		if p.Name == backend.ProtectionPrivateFiles {
			// Doctor's backend keeps no logs: look at the daemon's,
			// which it closes when it starts, changing nothing here.
			p = local.PrivateFiles(cfg.LogDir(), cfg.RunDir())
		}
		status := "ok"
		if !p.On {
			status = "warn"
		}
		r.line(status, labels[p.Name], "%s", p.Detail)
	}
	return b, true
}

// doctorExample checks the example's program (python3) and that the
// example model boots: it runs the echo project of the example manifest
// the way a replica runs (through b, the local-process backend with
// serve's sandbox: as the model user, in its cgroup and network), waits
// for its health check, and stops it. That proves that model servers can
// run here.
func doctorExample(r *doctorReport, b *local.Backend) {
	m, where, ok, err := exampleModel()
	switch {
	case err != nil:
		r.line("warn", "example", "cannot read the example manifest %s: %v; skipped the model boot check", where, err)
		return
	case !ok:
		r.line("warn", "example", "the example is not installed (looked for %s): skipped the model boot check", where)
		return
	}
	prog := m.Command[0]
	if !strings.Contains(prog, "/") {
		found, err := local.LookPath(prog)
		if err != nil {
			r.line("warn", "python3", "%s is not on PATH: the example model (%s) needs it; install python3", prog, m.Dir)
			return
		}
		prog = found
	}
	if _, err := os.Stat(prog); err != nil {
		r.line("warn", "python3", "%s, which the example model runs, is missing: install python3 (%v)", prog, err)
		return
	}
	r.line("ok", "python3", "%s", prog)
	took, err := bootExample(b, m)
	if err != nil {
		r.line("fail", "example", "%s did not boot: %v; model servers will fail the same way: check that the model user (see above) can run %s and read %s", m.Dir, err, prog, m.Dir)
		return
	}
	r.line("ok", "example", "%s boots and answers %s (%s)", m.Dir, m.HealthPath, took.Round(time.Millisecond))
}

// bootExample starts model m as a replica of b (which keeps no logs or pid
// files), waits until it answers its health check, and stops it; the
// process never outlives the call.
func bootExample(b *local.Backend, m store.ModelSpec) (time.Duration, error) {
	start := time.Now()
	m.Env = maps.Clone(m.Env)
	if m.Env == nil {
		m.Env = map[string]string{}
	}
	m.Env["PYTHONDONTWRITEBYTECODE"] = "1"
	inst, err := b.Launch(backend.Spec{
		ReplicaID: "doctor-example",
		ProjectID: "doctor-example",
		TeamID:    "doctor",
		Model:     m,
	})
	if err != nil {
		return 0, err
	}
	defer inst.Stop()
	t := time.NewTimer(exampleBootTimeout)
	defer t.Stop()
	select {
	case <-inst.Ready():
		return time.Since(start), nil
	case <-inst.Exited():
		return 0, fmt.Errorf("exited (%v): %s", inst.ExitErr(), lastLine(inst.LastLogLine()))
	case <-t.C:
		if bp := inst.BootProblem(); bp.Text != "" {
			return 0, fmt.Errorf("not ready within %s: %s; last output: %s", exampleBootTimeout, bp.Text, lastLine(inst.LastLogLine()))
		}
		return 0, fmt.Errorf("no answer on %s within %s: %s", m.HealthPath, exampleBootTimeout, lastLine(inst.LastLogLine()))
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	if s == "" {
		return "no output"
	}
	return s
}
