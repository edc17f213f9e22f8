// Package backend is the seam between the scheduler and whatever runs model
// servers: the [Backend] interface, the [Spec] of one replica to start, the
// [Instance] a started replica is, and the errors an Instance's Infer may
// return, which the scheduler turns into a call's message.
//
// The scheduler decides what runs where and when; a backend only runs what it
// is told, reports what it can place replicas on, keeps their logs and, after
// a daemon restart, deals with the replicas the previous daemon left behind.
// Today the one backend is scheduler/backend/local, which runs each replica
// as a process group on this machine; the model protocols (http, potassium)
// are clients in scheduler/backend/protocol that any backend can hand its
// own way of reaching the model (a dialer).
package backend

import (
	"context"
	"encoding/json"
	"io"

	"inferd/gpu"
	"inferd/store"
)

// Backend runs replicas of model servers. Its methods are safe for
// concurrent use.
type Backend interface {
	// Launch starts the replica described by spec and returns once it runs,
	// without waiting for it to be ready (see Instance.Ready). The boot
	// timeout is the caller's: Stop an Instance that is not ready in time.
	// A replica that cannot be started is an error, never a nil Instance.
	Launch(spec Spec) (Instance, error)

	// Capacity is what replicas can be placed on now. The scheduler reads
	// it on every placement, so GPU memory figures may move between calls.
	Capacity() Capacity

	// Recover deals with the replicas a previous run of the daemon left
	// running (Nomad's RecoverTask, for a daemon that died without stopping
	// them): they are not assumed dead. It is called once, before the first
	// Launch. No backend adopts such replicas today (the calls they ran are
	// failed as interrupted), so Recover cleans them up, and returns once
	// they are gone or it has given up on them; an error says what could
	// not be cleaned.
	Recover(ctx context.Context) error

	Logs
}

// Logs reads the replica logs a backend keeps. Logs outlive their replica,
// so that a crash can be read after the fact, and are kept per team, so that
// a project deleted and made again for another team never shows the new team
// the old team's output.
type Logs interface {
	// ReplicaLogs lists the logs kept for project's replicas, the most
	// recently written first: those kept for team, or for any team when team
	// is "" (the operator's view, which also finds a deleted project's
	// logs). A project without logs gives none and no error.
	ReplicaLogs(team, project string) ([]Log, error)

	// TailLog returns the last n lines of l (valid UTF-8, each cut at
	// MaxLogLineBytes, with terminal control characters escaped: a model's
	// output must not act on the operator's terminal), and the offset at
	// which output written after them starts, for FollowLog. A log that
	// does not exist is ErrNoLog.
	TailLog(l Log, n int) (lines []string, next int64, err error)

	// FollowLog writes to w what l gets after offset from (see TailLog),
	// escaped as TailLog's lines are, until ctx ends (then it returns nil)
	// or a write to w fails.
	FollowLog(ctx context.Context, l Log, from int64, w io.Writer) error
}

// MaxLogLineBytes is where TailLog cuts a long line.
const MaxLogLineBytes = 2000

// Log names one replica's log.
type Log struct {
	Team, Project, Replica string
}

// Spec describes one replica to start. It carries the project's model spec
// as a whole, so that a field added to store.ModelSpec reaches the backend
// without a mapping to update.
type Spec struct {
	ReplicaID string          // unique among the backend's replicas
	ProjectID string          // the project it serves
	TeamID    string          // the project's team: its logs are kept under it
	Model     store.ModelSpec // command, dir, env, protocol and its paths
	GPUs      []string        // UUIDs of the GPUs it may use; empty = CPU only
	// Phase, when set, is told what a launch is doing that may take long
	// (PhaseBuildingEnvironment), and "" once that is over; the backend
	// calls it from Launch, before Launch returns.
	Phase func(phase string)
	// Cancel, when set, is closed once the replica is no longer wanted
	// while Launch runs (its project deleted, stopped while it boots): a
	// long phase (a build) may give up, and Launch return an error.
	Cancel <-chan struct{}
}

// PhaseBuildingEnvironment: the launch builds the project's Python
// environment (a first boot), which bootTimeout does not count.
const PhaseBuildingEnvironment = "building environment"

// Capacity is what a backend can place replicas on.
type Capacity struct {
	CPUSlots int          // CPU replicas (gpus: 0) it runs at once
	GPUs     []gpu.Device // its GPUs, sorted by index; free memory as last read
}

// Instance is one replica started by Launch. Its methods are safe for
// concurrent use.
type Instance interface {
	// Ready is closed once the model answers its health check. It is never
	// closed if the replica exits or is stopped first.
	Ready() <-chan struct{}
	// Exited is closed once the replica has ended and everything it started
	// is gone.
	Exited() <-chan struct{}
	// ExitErr says how the replica ended ("exit status 1", "signal:
	// killed"), or nil for a clean exit; nil before Exited is closed.
	ExitErr() error
	// Infer sends req's inputs to the model and returns its JSON reply.
	// Errors: *HTTPError, *ExceptionError, ErrInvalidReply (wrapped) for
	// the model's own answers, ErrExited (wrapped) when the replica ended
	// during the call or before it; ctx's error is returned as is. A model
	// that streams its reply tells req.Stream each line as it comes, and
	// the reply is then the JSON array of the lines.
	Infer(ctx context.Context, req Request) (json.RawMessage, error)
	// InferBatch sends the inputs of several calls to the model in one
	// request (the batch protocol of a project with batch on; see
	// docs/protocols.md) and returns one item per input, in order: the
	// call's output, or the model's error for that call alone. Its errors
	// are Infer's, ErrInvalidReply also for a reply whose outputs are not
	// one per input; any error is the whole batch's. A batch reply never
	// streams, and a call with a route is never batched.
	InferBatch(ctx context.Context, inputs []json.RawMessage) ([]BatchItem, error)
	// Stop ends the replica, gracefully first, and returns once it has
	// exited. It is idempotent and safe to call concurrently.
	Stop()
	// LastLogLine is the last non-empty line the model printed (at most 500
	// bytes, terminal controls escaped as in TailLog), for error messages
	// such as a failed boot.
	LastLogLine() string
	// Info describes the replica for the operator.
	Info() Info
	// BootProblem says why the replica is not ready, as far as the backend
	// can tell: its last finding while it booted (zero when it has none).
	// It stays readable after Exited, so a failed boot can be explained.
	BootProblem() BootProblem
}

// BatchItem is one call's part of a batch's reply (Instance.InferBatch):
// its output, or Err, the model's error for that call alone (its
// {"error": "..."} item), when it has none.
type BatchItem struct {
	Output json.RawMessage
	Err    string
}

// BootProblem says why a replica did not get ready, in the operator's words.
type BootProblem struct {
	// Text is what is wrong and what to set, e.g. "no answer on
	// 127.0.0.1:41234 (the model must listen on $PORT); it listens on 5000"
	// or "GET /healthz answered 404 (set healthPath)"; "" when nothing is
	// known.
	Text string
	// Fatal says the backend stopped the replica for it, because waiting
	// would not help: a replica started from the same spec fails the same
	// way, so the scheduler need not retry it before the spec changes.
	Fatal bool
}

// Info describes a running replica for the status page and logs. Fields a
// backend has no notion of stay zero.
type Info struct {
	Pid int // the model's process id on this machine
}
