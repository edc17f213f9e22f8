package local

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"inferd/image"
	"inferd/pyenv"
	"inferd/scheduler/backend"
	"inferd/scheduler/backend/local/replicainit"
	"inferd/scheduler/backend/protocol"
	"inferd/store"
)

const (
	// drainWait bounds how long the log pipe is read after the group was killed. Only
	// a process that left the group (setsid) can hold the pipe open that long.
	drainWait = 2 * time.Second
	// dialTimeout bounds a loopback connect to the model; the client's pool
	// times each attempt and tries again (protocol/dial.go).
	dialTimeout = protocol.ConnectTimeout
	// exitGrace is how long a failed call waits to see whether the process is
	// exiting, which turns a broken connection into backend.ErrExited.
	exitGrace = time.Second
)

// dialFunc connects to a model, as net.Dialer.DialContext does.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// Process is one running (or exited) model server started by Launch. Its methods
// are safe for concurrent use.
type Process struct {
	b      *Backend
	spec   backend.Spec
	log    zerolog.Logger
	cmd    *exec.Cmd        // starts its init (replicainit.go), which starts the model
	init   *initProcess     // what the init says
	box    *box             // its sandbox
	pid    int              // of the leader, which is also the process group id; set before start returns
	port   int              // the loopback port the model was told to listen on (its PORT)
	held   bool             // port was taken from the backend's allocator (host network)
	dial   dialFunc         // how inferd reaches the model
	client *protocol.Client // health checks and calls
	sink   *logSink
	pipe   *os.File // read end of the model's stdout+stderr

	ready    chan struct{} // closed by the readiness poller
	output   chan struct{} // the model wrote output: a hint for the poller (1 buffered)
	exited   chan struct{} // closed by run, last
	stopping chan struct{} // closed by the first Stop
	stopOnce sync.Once

	mu      sync.Mutex
	reaped  bool  // the leader has been waited for: its pid may be reused, signal nothing
	exitErr error // set before exited is closed
	// bootProblem is the readiness poller's last finding (bootcheck.go).
	bootProblem backend.BootProblem

	parking parking // parking.go
	// image is the image the model runs in (imagerun.go); nil = the host.
	image *image.Image
	// venv is the Python environment it runs in (pythonenv.go); nil = none.
	venv *pyenv.Env
}

// start starts the model server described by spec and returns once the process
// runs; it does not wait for readiness (see Ready).
func (b *Backend) start(spec backend.Spec) (*Process, error) {
	p, err := b.startProcess(spec)
	if err != nil {
		return nil, fmt.Errorf("start replica %s: %w", spec.ReplicaID, err)
	}
	return p, nil
}

func (b *Backend) startProcess(spec backend.Spec) (*Process, error) {
	if err := b.checkSpec(spec); err != nil {
		return nil, err
	}
	im, err := b.resolveImage(spec.Model)
	if err != nil {
		return nil, err
	}
	x, err := b.sb.newBox(spec)
	if err != nil {
		return nil, err
	}
	p := &Process{
		b:        b,
		spec:     spec,
		box:      x,
		log:      b.log.With().Str("replica", spec.ReplicaID).Str("project", spec.ProjectID).Logger(),
		port:     modelPort,
		ready:    make(chan struct{}),
		output:   make(chan struct{}, 1),
		exited:   make(chan struct{}),
		stopping: make(chan struct{}),
		image:    im,
	}
	running := false // from then on run undoes what is set up here, once the process has exited
	defer func() {
		if !running {
			p.release()
		}
	}()
	p.dial = (&net.Dialer{Timeout: dialTimeout}).DialContext
	if x.private {
		p.dial = x.ns.DialContext
	} else {
		// On the host's network each replica needs a port of its own.
		if p.port, err = b.ports.take(); err != nil {
			return nil, err
		}
		p.held = true
	}
	p.client, err = protocol.New(protocol.Config{
		Protocol:      spec.Model.Protocol,
		HealthPath:    spec.Model.HealthPath,
		InferPath:     spec.Model.InferPath,
		BatchPath:     spec.Model.BatchPath,
		Addr:          "127.0.0.1:" + strconv.Itoa(p.port),
		Dial:          p.dial,
		MaxReplyBytes: b.maxReplyBytes,
		Log:           p.log,
	})
	if err != nil {
		return nil, err
	}
	env := spec.Model.Env
	if spec.Model.Protocol == store.ProtocolPotassium && !x.private {
		if env, err = preparePotassium(spec, x); err != nil {
			return nil, err
		}
	}
	logPath := b.logPath(spec)
	var budget *logBudget
	if logPath != "" {
		budget = b.budgets.of(filepath.Dir(logPath))
	}
	p.sink, err = openLogSink(logPath, b.cfg.LogMaxBytes, b.cfg.LogKeep, budget, func(err error) {
		p.log.Warn().Err(err).Str("log", logPath).Msg("replica log write failed; output is dropped")
	})
	if err != nil {
		return nil, err
	}
	// Before the model: its first replica builds its Python environment,
	// the build's output in its log.
	if p.venv, err = b.pythonEnv(spec, p.sink); err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("log pipe: %w", err)
	}
	p.pipe = r

	cmd, err := p.initCommand(env, w)
	if err != nil {
		w.Close()
		return nil, err
	}
	p.cmd = cmd

	started := make(chan error, 1)
	go p.run(started)
	err = <-started
	w.Close() // the child has its copy; ours would keep the pipe open forever
	if err != nil {
		if x.runAs != nil && errors.Is(err, os.ErrPermission) {
			err = fmt.Errorf("%w (the model runs as user %s: its dir and program must be readable by others; see replica.user)", err, x.runAs.Name)
		}
		return nil, err
	}
	ev := p.log.Info().Int("pid", p.pid).Strs("command", spec.Model.Command)
	if x.private {
		ev = ev.Str("network", "private")
	} else {
		ev = ev.Int("port", p.port)
	}
	if x.runAs != nil {
		ev = ev.Uint32("uid", x.runAs.UID)
	}
	ev.Msg("replica started")
	running = true
	return p, nil
}

// initCommand is the command that starts the replica: its init
// (replicainit.go), which starts the model in the rest of the box. env is
// the project's env as the model gets it; out takes the model's output.
func (p *Process) initCommand(env map[string]string, out *os.File) (*exec.Cmd, error) {
	spec, x := p.spec, p.box
	cfg := replicainit.Config{
		Namespaces:     x.namespaces,
		UserNamespaces: x.userNamespaces,
		Parent:         os.Getpid(),
	}
	if x.runAs != nil {
		cfg.Credential = x.runAs.Credential()
	}
	if x.namespaces {
		cfg.TmpBytes = int64(spec.Model.MemoryMiB) << 20
	}
	if p.image != nil {
		if err := p.imageInitConfig(&cfg, env, p.image); err != nil {
			return nil, err
		}
	} else if err := p.hostInitConfig(&cfg, env); err != nil {
		return nil, err
	}
	cmd, ip, err := initCommand(cfg, spec.ReplicaID)
	if err != nil {
		return nil, err
	}
	p.init = ip
	cmd.Dir = "/"
	// The write end is an *os.File, so exec hands it to the child as is and starts no
	// copying goroutine of its own; Wait then returns when the leader exits, even if
	// a leaked child still holds the pipe.
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr.Setpgid = true
	if fd := x.cgroupFD(); fd >= 0 {
		// Born in its cgroup (clone3): there is no moment it could fork
		// outside it.
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	}
	return cmd, nil
}

// hostInitConfig fills what cfg needs to start the model from the host's
// files: its program found on the daemon's PATH, its dir as exec would
// take it.
func (p *Process) hostInitConfig(cfg *replicainit.Config, env map[string]string) error {
	spec, x := p.spec, p.box
	program := spec.Model.Command[0]
	if !strings.Contains(program, "/") {
		// On the daemon's PATH, as exec.Command finds it (the environment's
		// bin first).
		var err error
		if program, err = lookPath(program, p.venv); err != nil {
			return err
		}
	}
	// Where exec would have started it: relative to the daemon's working
	// directory (the init starts in /).
	dir, err := filepath.Abs(spec.Model.Dir)
	if err != nil {
		return fmt.Errorf("model dir: %w", err)
	}
	if p.venv != nil {
		env = activated(env, p.venv)
	}
	cfg.Path, cfg.Args, cfg.Dir = program, spec.Model.Command, dir
	cfg.Env = environ(spec, env, p.port, x.runAs, x.dir, p.b.cfg.PassEnv, os.LookupEnv)
	if x.namespaces {
		cfg.Keep = keepPaths(dir, program, spec.Model.Command[1:], x.dir)
		if p.venv != nil {
			// The data dir, where the environment is, is closed to the
			// model's uid: an empty tmpfs covers it (or the directory
			// above it that is closed) and the environment is bound back
			// (pythonenv.go).
			cfg.Keep = append(cfg.Keep, p.venv.Dir)
			if hide := closedAncestor(filepath.Dir(p.b.cfg.PythonDir)); hide != "" {
				cfg.Hide = append(cfg.Hide, hide)
			}
		}
	}
	return nil
}

// release undoes what startProcess set up, once the process (if it ever
// ran) and everything it started are gone: the client, the log, the port
// and the box.
func (p *Process) release() {
	if p.client != nil {
		p.client.Close()
	}
	if p.pipe != nil {
		p.pipe.Close()
	}
	if p.init != nil {
		p.init.close()
	}
	if p.sink != nil {
		if err := p.sink.Close(); err != nil {
			p.log.Warn().Err(err).Msg("close replica log")
		}
	}
	if p.held {
		p.b.ports.release(p.port)
	}
	if err := p.box.undo(); err != nil {
		p.log.Warn().Err(err).Msg("replica sandbox not fully removed")
	}
}

// run starts the child, reports the outcome on started, then owns it until it has
// exited: it waits for the leader, kills the rest of its cgroup (or group), ends the
// copier and the poller, removes the pid file, undoes the box and finally closes
// exited.
//
// The goroutine stays locked to its OS thread for as long as the child runs, because
// Pdeathsig fires when the thread that forked the child exits, not the process; and
// it never unlocks it, because entering the box changed the thread (its network
// namespace, its capabilities): the thread ends with the goroutine.
func (p *Process) run(started chan<- error) {
	runtime.LockOSThread()

	err := p.box.enter()
	if err == nil {
		err = p.cmd.Start()
	}
	if err != nil {
		// Out of the replica's v1 cgroups before the failure is told:
		// release removes them at once, and a thread still in one (this
		// one ends only with the goroutine) would keep it.
		if lerr := p.box.left(); lerr != nil {
			p.log.Warn().Err(lerr).Msg("replica sandbox: the forking thread stays in the replica's cgroup until it exits")
		}
		started <- err
		return
	}
	p.pid = p.cmd.Process.Pid
	if err := p.box.left(); err != nil {
		p.log.Warn().Err(err).Msg("replica sandbox: the forking thread stays in the replica's cgroup until it exits")
	}
	if err := p.init.handOver(); err != nil {
		syscall.Kill(-p.pid, syscall.SIGKILL)
		p.box.kill()
		p.cmd.Wait()
		started <- err
		return
	}
	if err := p.box.started(p.pid); err != nil {
		p.log.Warn().Err(err).Msg("replica sandbox: pidsMax stays raised by the init's allowance")
	}
	if runDir := p.b.cfg.RunDir; runDir != "" {
		rec := pidFile{ID: p.spec.ReplicaID, ProjectID: p.spec.ProjectID, Pid: p.pid, Pgid: p.pid}
		if err := writePidFile(runDir, rec); err != nil {
			// Without the record a daemon crash could leak this group: refuse to run.
			syscall.Kill(-p.pid, syscall.SIGKILL)
			p.box.kill()
			p.cmd.Wait()
			started <- err
			return
		}
	}
	started <- nil

	copied := make(chan struct{})
	go p.copyLog(copied)
	ctx, cancel := context.WithCancel(context.Background())
	var poller sync.WaitGroup
	poller.Go(func() { p.pollReady(ctx) })

	err = p.init.exitErr(p.cmd.Wait())

	p.mu.Lock()
	// The leader is gone but its group id stays reserved while members remain, so
	// this reaches leaked children and nothing else.
	syscall.Kill(-p.pid, syscall.SIGKILL)
	p.reaped = true
	p.mu.Unlock()
	// Then whatever left the group: the cgroup holds the whole tree.
	if _, kerr := p.box.kill(); kerr != nil {
		p.log.Error().Err(kerr).Msg("replica sandbox: killing the replica's cgroup failed")
	}
	if n := p.box.oomKills(); n > 0 {
		err = &backend.OutOfMemoryError{LimitMiB: p.spec.Model.MemoryMiB, Err: err}
		p.log.Warn().Int("oom_kills", n).Int("memoryMiB", p.spec.Model.MemoryMiB).Msg("replica ran out of memory")
	}

	cancel()
	select {
	case <-copied:
	case <-time.After(drainWait): // without a cgroup, a process that left the group holds the pipe
	}
	p.pipe.Close() // unblocks the copier's Read if it is still waiting
	<-copied
	poller.Wait()
	if runDir := p.b.cfg.RunDir; runDir != "" {
		if err := os.Remove(pidFilePath(runDir, p.spec.ReplicaID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			p.log.Warn().Err(err).Msg("remove replica pid file")
		}
	}
	// Info, not an error: whether this exit is a failure is the scheduler's call.
	ev := p.log.Info().Int("pid", p.pid)
	if err != nil {
		ev = ev.Str("exit", err.Error()).Str("last_line", p.sink.LastLine())
	}
	ev.Msg("replica exited")
	p.release()
	p.mu.Lock()
	p.exitErr = err
	p.mu.Unlock()
	close(p.exited)
}

// copyLog copies the model's output into the sink until the pipe closes.
func (p *Process) copyLog(done chan<- struct{}) {
	defer close(done)
	buf := make([]byte, 32<<10)
	for {
		n, err := p.pipe.Read(buf)
		if n > 0 {
			p.sink.Write(buf[:n])
			select { // wake the readiness poller; one pending hint is enough
			case p.output <- struct{}{}:
			default:
			}
		}
		if err != nil {
			return
		}
	}
}

// signal sends sig to the process group unless the leader has been reaped.
func (p *Process) signal(sig syscall.Signal) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.reaped {
		syscall.Kill(-p.pid, sig)
	}
}

// Info describes the replica: its process id.
func (p *Process) Info() backend.Info { return backend.Info{Pid: p.pid} }

// Ready returns a channel closed once GET HealthPath has answered 2xx. It is never
// closed if the process exits or is stopped first, and never after Exited.
func (p *Process) Ready() <-chan struct{} { return p.ready }

// Exited returns a channel closed once the process has exited, its group has been
// killed and all of the Process's goroutines have ended.
func (p *Process) Exited() <-chan struct{} { return p.exited }

// ExitErr returns how the process ended, as exec reports it ("exit status 1",
// "signal: killed"), or nil for a clean exit. Before Exited is closed it returns nil.
func (p *Process) ExitErr() error {
	select {
	case <-p.exited:
		return p.exitErr
	default:
		return nil
	}
}

// Stop stops the process with the backend's StopGrace; see stop. A parked
// replica is killed at once: frozen, it cannot answer a SIGTERM, and it has
// nothing in flight.
func (p *Process) Stop() {
	if p.parking.parked.Load() {
		p.stop(0)
		return
	}
	p.stop(p.b.cfg.StopGrace)
}

// stop sends SIGTERM to the process group, waits up to grace for the process to exit,
// then sends SIGKILL, and returns once it has exited. It is idempotent and safe to
// call concurrently; every call returns only after the process has exited.
func (p *Process) stop(grace time.Duration) {
	p.stopOnce.Do(func() { close(p.stopping) })
	select {
	case <-p.exited:
		return
	default:
	}
	p.signal(syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.exited:
		return
	case <-t.C:
	}
	p.signal(syscall.SIGKILL)
	<-p.exited
}

// LastLogLine returns the last non-empty line the model printed on stdout or stderr
// (at most 500 bytes), for error messages such as a failed boot, with terminal
// controls escaped (logescape.go).
func (p *Process) LastLogLine() string { return escapeLine(p.sink.LastLine()) }

// Infer sends inputs to the model; see backend.Instance. A broken exchange with
// a model that exits at about the same time is backend.ErrExited.
func (p *Process) Infer(ctx context.Context, req backend.Request) (json.RawMessage, error) {
	return request(p, ctx, req, p.client.Infer)
}

// InferBatch sends a batch of calls' inputs to the model; see
// backend.Instance. Its errors are Infer's.
func (p *Process) InferBatch(ctx context.Context, inputs []json.RawMessage) ([]backend.BatchItem, error) {
	return request(p, ctx, inputs, p.client.InferBatch)
}

// request sends in to the model with send, unless the process has exited;
// a broken exchange with a model that exits at about the same time is
// backend.ErrExited.
func request[In, Out any](p *Process, ctx context.Context, in In, send func(context.Context, In) (Out, error)) (Out, error) {
	var none Out
	if err := p.exitedErr(); err != nil {
		return none, err
	}
	out, err := send(ctx, in)
	var broken *protocol.TransportError
	if errors.As(err, &broken) {
		return none, p.callFailed(ctx, err)
	}
	return out, err
}

// callFailed waits briefly for the process to exit after a transport error:
// if it does, the call failed because of the exit (ErrExited).
func (p *Process) callFailed(ctx context.Context, err error) error {
	t := time.NewTimer(exitGrace)
	defer t.Stop()
	select {
	case <-p.exited:
		return p.exitedErr()
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return err
	}
}

// exitedErr returns backend.ErrExited, wrapped with the exit status, once the
// process has exited, and nil before.
func (p *Process) exitedErr() error {
	select {
	case <-p.exited:
	default:
		return nil
	}
	if p.exitErr != nil {
		return fmt.Errorf("%w (%v)", backend.ErrExited, p.exitErr)
	}
	return backend.ErrExited
}
