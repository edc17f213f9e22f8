package replica

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/rs/zerolog"
)

const (
	// drainWait bounds how long the log pipe is read after the group was killed. Only
	// a process that left the group (setsid) can hold the pipe open that long.
	drainWait = 2 * time.Second
	// maxIdleConns is the keep-alive pool per replica: at least as many connections
	// as calls a replica may serve at once (a project's concurrency goes up to
	// store.MaxConcurrency, and can be raised while the replica runs), so that no
	// finished call's connection is closed only to be dialled again for the next.
	// Idle connections exist only up to the peak of calls in flight and close after
	// idleConnTimeout.
	maxIdleConns = 1000
	// idleConnTimeout closes a keep-alive connection unused this long.
	idleConnTimeout = 90 * time.Second
	// dialTimeout bounds a loopback connect to the model.
	dialTimeout = time.Second
)

// Process is one running (or exited) model server started by Start. Its methods are
// safe for concurrent use.
type Process struct {
	spec    Spec
	log     zerolog.Logger
	cmd     *exec.Cmd
	pid     int
	port    int
	baseURL string       // http://127.0.0.1:PORT
	client  *http.Client // calls with a large body (see fastPathMaxBody)
	conns   *connPool    // health checks and the other calls: see connPool
	sink    *logSink
	pipe    *os.File // read end of the model's stdout+stderr

	maxReply int64 // Infer's reply cap; a field so tests can lower it

	ready    chan struct{} // closed by the readiness poller
	output   chan struct{} // the model wrote output: a hint for the poller (1 buffered)
	exited   chan struct{} // closed by run, last
	stopping chan struct{} // closed by the first Stop
	stopOnce sync.Once

	mu      sync.Mutex
	reaped  bool  // the leader has been waited for: its pid may be reused, signal nothing
	exitErr error // set before exited is closed
}

// Start starts the model server described by spec and returns once the process
// runs; it does not wait for readiness (see Ready). The boot timeout is the caller's:
// Stop a process that is not Ready in time. log receives one line at start and exit.
func Start(spec Spec, log zerolog.Logger) (*Process, error) {
	spec, err := spec.withDefaults()
	if err != nil {
		return nil, fmt.Errorf("start replica %s: %w", spec.ID, err)
	}
	if spec.Protocol == ProtocolPotassium {
		if spec, err = preparePotassium(spec); err != nil {
			return nil, fmt.Errorf("start replica %s: %w", spec.ID, err)
		}
	}
	p, err := start(spec, log)
	if err != nil {
		return nil, fmt.Errorf("start replica %s: %w", spec.ID, err)
	}
	return p, nil
}

func start(spec Spec, log zerolog.Logger) (*Process, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	running := false // from then on the port is given back once the process has exited (run)
	defer func() {
		if !running {
			releasePort(port)
		}
	}()
	log = log.With().Str("replica", spec.ID).Str("project", spec.ProjectID).Logger()
	sink, err := openLogSink(spec.LogPath, spec.LogMaxBytes, spec.LogKeep, func(err error) {
		log.Warn().Err(err).Str("log", spec.LogPath).Msg("replica log write failed; output is dropped")
	})
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		sink.Close()
		return nil, fmt.Errorf("log pipe: %w", err)
	}

	cmd := exec.Command(spec.Command[0], spec.Command[1:]...)
	cmd.Dir = spec.Dir
	cmd.Env = spec.environ(port, os.LookupEnv)
	// The write end is an *os.File, so exec hands it to the child as is and starts no
	// copying goroutine of its own; Wait then returns when the leader exits, even if
	// a leaked child still holds the pipe.
	cmd.Stdout, cmd.Stderr = w, w
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if spec.RunAs != nil {
		// Go sets the parent-death signal after changing credentials, which
		// would otherwise clear it.
		cmd.SysProcAttr.Credential = spec.RunAs.credential()
	}

	transport := &http.Transport{
		Proxy:               nil, // loopback only: never a proxy from the daemon's env
		DialContext:         (&net.Dialer{Timeout: dialTimeout}).DialContext,
		MaxIdleConns:        maxIdleConns,
		MaxIdleConnsPerHost: maxIdleConns,
		IdleConnTimeout:     idleConnTimeout,
	}
	p := &Process{
		spec:     spec,
		log:      log,
		cmd:      cmd,
		port:     port,
		baseURL:  "http://127.0.0.1:" + strconv.Itoa(port),
		client:   &http.Client{Transport: transport}, // no timeout: each call's ctx decides
		conns:    newConnPool("127.0.0.1:"+strconv.Itoa(port), dialTimeout, maxIdleConns, idleConnTimeout),
		sink:     sink,
		pipe:     r,
		maxReply: maxReplyBytes,
		ready:    make(chan struct{}),
		output:   make(chan struct{}, 1),
		exited:   make(chan struct{}),
		stopping: make(chan struct{}),
	}

	started := make(chan error, 1)
	go p.run(started)
	err = <-started
	w.Close() // the child has its copy; ours would keep the pipe open forever
	if err != nil {
		r.Close()
		sink.Close()
		if spec.RunAs != nil && errors.Is(err, os.ErrPermission) {
			err = fmt.Errorf("%w (the model runs as user %s: its dir and program must be readable by that user; see replica.user)", err, spec.RunAs.Name)
		}
		return nil, err
	}
	log.Info().Int("pid", p.pid).Int("port", port).Strs("command", spec.Command).Msg("replica started")
	running = true
	return p, nil
}

// run starts the child, reports the outcome on started, then owns it until it has
// exited: it waits for the leader, kills the rest of the group, ends the copier and
// the poller, removes the pid file and finally closes exited.
//
// The goroutine stays locked to its OS thread for as long as the child runs, because
// Pdeathsig fires when the thread that forked the child exits, not the process.
func (p *Process) run(started chan<- error) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	if err := p.cmd.Start(); err != nil {
		started <- err
		return
	}
	p.pid = p.cmd.Process.Pid
	if p.spec.RunDir != "" {
		rec := pidFile{ID: p.spec.ID, ProjectID: p.spec.ProjectID, Pid: p.pid, Pgid: p.pid}
		if err := writePidFile(p.spec.RunDir, rec); err != nil {
			// Without the record a daemon crash could leak this group: refuse to run.
			syscall.Kill(-p.pid, syscall.SIGKILL)
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

	err := p.cmd.Wait()

	p.mu.Lock()
	// The leader is gone but its group id stays reserved while members remain, so
	// this reaches leaked children and nothing else.
	syscall.Kill(-p.pid, syscall.SIGKILL)
	p.reaped = true
	p.exitErr = err
	p.mu.Unlock()

	cancel()
	select {
	case <-copied:
	case <-time.After(drainWait): // a process that left the group holds the pipe
	}
	p.pipe.Close() // unblocks the copier's Read if it is still waiting
	<-copied
	poller.Wait()
	p.client.CloseIdleConnections()
	p.conns.close()
	if err := p.sink.Close(); err != nil {
		p.log.Warn().Err(err).Msg("close replica log")
	}
	if p.spec.RunDir != "" {
		if err := os.Remove(pidFilePath(p.spec.RunDir, p.spec.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			p.log.Warn().Err(err).Msg("remove replica pid file")
		}
	}
	// Info, not an error: whether this exit is a failure is the scheduler's call.
	ev := p.log.Info().Int("pid", p.pid)
	if err != nil {
		ev = ev.Str("exit", err.Error()).Str("last_line", p.sink.LastLine())
	}
	ev.Msg("replica exited")
	releasePort(p.port)
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

// ID returns the replica id from the Spec.
func (p *Process) ID() string { return p.spec.ID }

// Pid returns the process id of the model server, which is also its process group id.
func (p *Process) Pid() int { return p.pid }

// Port returns the loopback port the model was told to listen on (its PORT).
func (p *Process) Port() int { return p.port }

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

// Stop sends SIGTERM to the process group, waits up to grace for the process to exit,
// then sends SIGKILL, and returns once it has exited. It is idempotent and safe to
// call concurrently; every call returns only after the process has exited.
func (p *Process) Stop(grace time.Duration) {
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
// (at most 500 bytes), for error messages such as a failed boot.
func (p *Process) LastLogLine() string { return p.sink.LastLine() }
