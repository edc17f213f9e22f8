package scheduler

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// A failed boot says why in the words an operator can act on: the calls that
// wait for it read "booting (attempt 2 of 3; last: …)", the calls it fails
// and the status page "model failed to start: …". A failure that retrying
// the same spec cannot mend (the model listens on another port, its health
// path answers 404, it was not ready within bootTimeout, its program cannot
// be started) fails the waiting calls at once; a crash at boot is retried
// MaxBootFailures times first. Once calls have failed for it, new calls fail
// at once with the same reason until the project's backoff ends or its spec
// changes.

// bootFailure is why one boot failed.
type bootFailure struct {
	text  string // e.g. "process exited with status 1: ModuleNotFoundError: No module named 'torch'"
	short string // text without the model's output, for pending messages; "" = text
	fatal bool   // retrying the same spec will not help
}

// ErrBootFailed is wrapped by Submit's error when the project's boots have
// failed and its backoff still runs: the call would wait only to fail.
var ErrBootFailed = errors.New("model failed to start")

// bootFailedError: "model failed to start: <reason> (next boot in 4s, or at
// once when the project changes)".
type bootFailedError struct {
	reason string
	next   time.Duration
}

func (e *bootFailedError) Error() string {
	return fmt.Sprintf("%s: %s (next boot in %s, or at once when the project changes)",
		ErrBootFailed, e.reason, e.next.Round(time.Second))
}

func (e *bootFailedError) Unwrap() error { return ErrBootFailed }

// bootExited: the process ended before it was ready.
func bootExited(exitErr error, lastLine string) bootFailure {
	how := "process exited with status 0"
	if exitErr != nil {
		how = "process exited (" + exitErr.Error() + ")"
		if code, ok := strings.CutPrefix(exitErr.Error(), "exit status "); ok {
			how = "process exited with status " + code
		}
	}
	if lastLine == "" {
		return bootFailure{text: how + " and printed nothing"}
	}
	return bootFailure{text: how + ": " + lastLine, short: how}
}

// bootTimedOut: the boot timeout stopped it; the backend's last finding and
// the model's last line say what it was doing.
func bootTimedOut(timeout int, problem backend.BootProblem, lastLine string) bootFailure {
	f := bootFailure{text: fmt.Sprintf("not ready after bootTimeout %ds", timeout), fatal: true}
	if problem.Text != "" {
		f.text += ": " + problem.Text
	}
	f.short = f.text
	if lastLine != "" {
		f.text += "; last output: " + lastLine
	}
	return f
}

// pending is the failure as a waiting call may show it: a pending message
// never contains "error" (clients take it for a failure), and the model's
// output may say anything.
func (f bootFailure) pending() string {
	s := f.short
	if s == "" {
		s = f.text
	}
	if strings.Contains(strings.ToLower(s), "error") {
		return "the model did not get ready"
	}
	return s
}

// bootingMessage is the message of a call that waits for p's boot, after a
// failed one: "booting (attempt 2 of 3; last: process exited with status 1)".
func (s *Scheduler) bootingMessage(p *project) string {
	return fmt.Sprintf("booting (attempt %d of %d; last: %s)", p.bootFailures+1, s.cfg.MaxBootFailures, p.lastBoot.pending())
}

// bootFailed counts a failed boot and backs off (unless the boot timeout
// already did); a fatal failure, or MaxBootFailures in a row, fails the
// project's queued calls with the reason, and the count starts over.
func (s *Scheduler) bootFailed(p *project, r *rep, f bootFailure, backoff bool) {
	p.bootFailures++
	p.lastBoot = f
	p.lastError = "model failed to start: " + f.text
	p.lastErrorReplica, p.lastErrorAt = r.id, s.clk.Now()
	s.log.Warn().Str("project", p.id).Str("replica", r.id).Int("failures", p.bootFailures).
		Bool("fatal", f.fatal).Str("reason", f.text).Msg("replica failed to boot")
	if backoff {
		s.startBackoff(p)
	}
	p.warmed(errors.New(p.lastError))
	p.refusing = false
	if p.retiringCount() > 0 {
		// A roll onto a spec that does not boot: the old replicas keep
		// serving the calls (rollout.go), so none fails for it.
		p.lastError += " (the replicas of the previous spec keep serving)"
		return
	}
	if f.fatal || p.bootFailures >= s.cfg.MaxBootFailures {
		p.bootFailures = 0
		p.refusing = true
		s.failQueued(p, failed(store.FailNotStarted, msgFailedToStart(f.text)))
	}
}

// refuse returns the error a new call of p gets at once because p's boots
// have failed and its backoff runs, or nil.
func (s *Scheduler) refuse(p *project) error {
	if !p.refusing || !p.backoffT.armed() {
		return nil
	}
	return &bootFailedError{reason: p.lastBoot.text, next: p.backoffT.at.Sub(s.clk.Now())}
}

// waitingText is why p's work waits, for the status: its team's quota, the
// scheduler's reason (a CPU slot, a GPU), else its boot retries.
func (s *Scheduler) waitingText(p *project) string {
	switch {
	case p.quotaWait != "":
		return p.quotaWait
	case p.waiting != "":
		return p.waiting
	case p.refusing && p.backoffT.armed():
		return fmt.Sprintf("boots failed: new calls fail until the next boot in %s, or until the project changes",
			p.backoffT.at.Sub(s.clk.Now()).Round(time.Second))
	case p.bootFailures > 0 && (p.booting() || p.backoffT.armed()):
		return s.bootingMessage(p)
	}
	return ""
}
