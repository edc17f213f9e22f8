package local

import (
	"context"
	"syscall"
	"time"

	"inferd/scheduler/backend"
)

// readyAttemptTimeout bounds one health check.
const readyAttemptTimeout = time.Second

// defaultReadyIntervals are the pauses between health checks after a start or after
// the model last wrote output; the last one repeats. A model is often listening
// within a few milliseconds of its first line, so the first checks come quickly and
// then back off to a steady pace: at most 100 refused loopback connects a second
// while a model loads, and about 1 ms of detection delay for a model that is up at
// once.
var defaultReadyIntervals = []time.Duration{
	1 * time.Millisecond,
	2 * time.Millisecond,
	5 * time.Millisecond,
	10 * time.Millisecond,
}

// pollReady checks the model's health until it answers 2xx, then closes ready. It
// checks at once, then after each of the backend's readyIntervals, and again as soon
// as the model writes to stdout or stderr (most servers print a line once they
// listen), which also starts the intervals over. It gives up when ctx ends (the
// process exited) or Stop is called. The boot deadline is the scheduler's, not ours,
// but each failed check is diagnosed (see bootWatch), and a finding that waiting will
// not fix stops the process (giveUp).
func (p *Process) pollReady(ctx context.Context) {
	intervals := p.b.readyIntervals
	next := 0
	t := time.NewTimer(intervals[0])
	defer t.Stop()
	w := &bootWatch{port: p.port, pgid: p.pid, healthPath: p.client.HealthPath(), listening: p.b.listening}
	for {
		status, err := p.health(ctx)
		if err == nil && status >= 200 && status < 300 {
			p.setBootProblem(backend.BootProblem{})
			close(p.ready)
			return
		}
		if ctx.Err() != nil {
			return
		}
		select {
		case <-p.stopping:
			// A check cut short by our own stop (the model closes its
			// connections on SIGTERM) says nothing about the model: the
			// finding from before the stop stands.
			return
		default:
		}
		problem := w.observe(time.Now(), status, err)
		p.setBootProblem(problem)
		if problem.Fatal {
			p.giveUp(ctx, problem)
			return
		}
		t.Reset(intervals[min(next, len(intervals)-1)])
		next++
		select {
		case <-ctx.Done():
			return
		case <-p.stopping:
			return
		case <-p.output:
			next = 0
		case <-t.C:
		}
	}
}

// health makes one health check.
func (p *Process) health(ctx context.Context) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, readyAttemptTimeout)
	defer cancel()
	return p.client.Health(ctx)
}

func (p *Process) setBootProblem(bp backend.BootProblem) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.bootProblem = bp
}

// BootProblem returns the last finding of the readiness checks: why the model
// is not ready, or why it was stopped before it was.
func (p *Process) BootProblem() backend.BootProblem {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.bootProblem
}

// giveUp stops a model that cannot get ready as it is (SIGTERM to its group,
// SIGKILL after the stop grace) and returns once it has exited, or Stop has
// taken over. It runs on the poller, which run waits for only after the
// process has exited, so it must not call stop (which waits for run).
func (p *Process) giveUp(ctx context.Context, problem backend.BootProblem) {
	p.log.Warn().Str("problem", problem.Text).Msg("replica cannot get ready; stopping it")
	p.signal(syscall.SIGTERM)
	t := time.NewTimer(p.b.cfg.StopGrace)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-p.stopping:
	case <-t.C:
		p.signal(syscall.SIGKILL)
	}
}
