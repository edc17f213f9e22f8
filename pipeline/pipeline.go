package pipeline

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"time"

	"inferd/scheduler"
	"inferd/store"
)

// Scheduler is what the pipeline needs of the scheduler.
type Scheduler interface {
	// Start admits a call (or finds the one a repeated idempotency key
	// made) and, when req.Wait is set, waits up to it or until ctx ends;
	// the returned call is durable. ctx never cancels the call.
	Start(ctx context.Context, p store.Project, req scheduler.Request) (store.Call, error)
	// Lookup returns the call and a channel closed once its final result
	// is durable.
	Lookup(id string) (store.Call, <-chan struct{}, error)
}

// Config is what a Pipeline is made of.
type Config struct {
	Store Store
	// StartLookup, when set, reads a key and the project of a modelKey
	// together (store/etcd: one round trip).
	StartLookup func(secret, modelKey string) store.StartLookup
	Sched       Scheduler
	// Place says where a call runs; nil is Local.
	Place Placer
	// KeyHooks run once the key is known, before its project is looked
	// up (its rate), and hold nothing past that; CallHooks once the
	// project is known and the call runs here, before it starts (its
	// waits and streams), holding what they take until Outcome.Release.
	// Each list runs in order.
	KeyHooks, CallHooks []Hook
	// Stopping is closed when inferd shuts down: Await stops waiting.
	Stopping <-chan struct{}
	// Reread bounds the read of a call at the end of an Await (cluster
	// mode, where etcd may not answer): past it, Await answers the state
	// it last saw. 0: the read is not bounded (a single box's own file).
	Reread time.Duration
	// Now is the clock of key expiry; nil is time.Now.
	Now func() time.Time
	// OnRefusal, when set, hears each refusal by a hook: its name and its
	// error (the metrics' counters).
	OnRefusal func(hook string, err error)
	// MaxInputDepth bounds the nesting of a call's inputs
	// (limits.maxInputDepth); 0: no bound.
	MaxInputDepth int
}

// Pipeline is the one call path (see the package comment). It is safe for
// concurrent use.
type Pipeline struct {
	cfg      Config
	place    Placer
	names    names
	refusals map[string]*atomic.Uint64
}

// New returns the pipeline of cfg.
func New(cfg Config) *Pipeline {
	p := &Pipeline{cfg: cfg, place: cfg.Place, refusals: counters(cfg.KeyHooks, cfg.CallHooks)}
	if p.place == nil {
		p.place = Local{}
	}
	p.names.list = cfg.Store.ListProjects
	return p
}

// ProjectChanged tells the pipeline that project id was created, changed
// or deleted (the store's OnProjectChange): the model names are read
// again.
func (p *Pipeline) ProjectChanged(string) { p.names.changed() }

// Request is a call as a door decoded it.
type Request struct {
	Secret string // the API key
	Target Target
	// Operator marks a request of the daemon's operator (inferd call over
	// the admin socket, or such a request another node forwarded): it
	// has no key, names its project by id (Target.ProjectID), reaches
	// every team's, and no admission hook runs for it: the hooks are
	// keys' budgets.
	Operator bool
	// Call is the call's inputs and call-control fields (its Wait is
	// Start's to set: see Sync).
	Call scheduler.Request
	// Prepare, when set, completes Call once the project is known and the
	// call runs here (an OpenAI request's body names the served model;
	// a forward sends the body as it came). Its error is RefusedRequest.
	Prepare func(p store.Project, call *scheduler.Request) error
	Hold    Hold
	// MayDegrade: see Admission.
	MayDegrade bool
	// Wait bounds how long the request may wait on its call, for project
	// p: on the node it is forwarded to, and here when Sync.
	Wait func(p store.Project) time.Duration
	// Sync makes a HoldWait request wait for its call inside Start, up to
	// Wait, under ctx (scheduler.Request.Wait: a call that finishes
	// within it is written once, with its result). A request that needs
	// its call durable before it runs (a stream, /run's idempotent retry)
	// is not Sync.
	Sync bool

	// FromNode says another node of the cluster forwarded the request to
	// this one: the key's rate was spent where the client sent it
	// (Admission.FromNode), so a start spends it once.
	FromNode bool

	// The door's exchange, which a Remote forwards as it was sent: the
	// writer, the request and its body as read.
	W    http.ResponseWriter
	R    *http.Request
	Body []byte
}

// wait is req.Wait for p, or 0 without one.
func (req Request) wait(p store.Project) time.Duration {
	if req.Wait == nil {
		return 0
	}
	return req.Wait(p)
}

// Outcome is a started call, or a request answered by another node
// (Forwarded).
type Outcome struct {
	Caller
	Call      store.Call
	Hold      Hold // what the request holds: a degraded wait holds nothing
	Forwarded bool // answered by the node that ran it: nothing more to write
	release   func()
}

// Release gives back what the admission hooks took for the request: once
// the door has answered it (at once for a Banana start, whose wait
// happened inside Start).
func (o *Outcome) Release() {
	if o.release != nil {
		o.release()
		o.release = nil
	}
}

// RefusedRequest: Prepare refused the request (a text for users).
const RefusedRequest Kind = -1

// RefusedPlace: the Placer refused (Err says why; cluster mode).
const RefusedPlace Kind = -2

// ErrNoNode is a forward that no node took: retry, another node may.
var ErrNoNode = errors.New("cluster unavailable; retry")

// Start resolves, admits, places and starts req's call. A refusal comes
// before any call exists; a forwarded request has been answered.
func (p *Pipeline) Start(ctx context.Context, req Request) (Outcome, *Refusal) {
	if ref := p.checkInputs(req); ref != nil {
		return Outcome{}, ref
	}
	var c Caller
	var ref *Refusal
	a := &Admission{FromNode: req.FromNode} // the key's hooks', then the call's
	if req.Operator {
		c, ref = p.operator(req.Target)
	} else {
		c, ref = p.resolve(req.Secret, req.Target, a)
	}
	if ref != nil {
		return Outcome{}, ref
	}
	remote, err := p.place.Place(req.R, c.Project)
	if err != nil {
		return Outcome{}, &Refusal{Kind: RefusedPlace, Err: err}
	}
	if remote != nil {
		return p.forward(remote, c, req) // the request goes as it was sent
	}
	call := req.Call
	if req.Prepare != nil {
		// A copy of its own: &req.Call would move all of req to the heap
		// on every start, with a Prepare or without.
		prepared := call
		if err := req.Prepare(c.Project, &prepared); err != nil {
			return Outcome{}, &Refusal{Kind: RefusedRequest, Err: err}
		}
		call = prepared
	}
	// The hooks that hold something for the call's life run where it
	// runs: a forwarded request is held on the node that runs it.
	*a = Admission{Key: c.Key, Project: c.Project, Hold: req.Hold, MayDegrade: req.MayDegrade}
	hooks := p.cfg.CallHooks
	if req.Operator {
		hooks = nil
	}
	release, ref := p.admit(hooks, a)
	if ref != nil {
		return Outcome{}, ref
	}
	call.Wait = 0
	startCtx := context.WithoutCancel(ctx) // the call is the server's once admitted
	if a.Hold == HoldWait && req.Sync {
		// A sync start waits inside Start, under the client's context;
		// that context never cancels the call itself.
		call.Wait, startCtx = req.wait(c.Project), ctx
		extendWriteDeadline(req.W, call.Wait)
	}
	started, err := p.cfg.Sched.Start(startCtx, c.Project, call)
	if err != nil {
		release()
		return Outcome{}, refused(err)
	}
	return Outcome{Caller: c, Call: started, Hold: a.Hold, release: release}, nil
}

// forward runs the request on remote; the request is answered there.
func (p *Pipeline) forward(remote Remote, c Caller, req Request) (Outcome, *Refusal) {
	wait := req.wait(c.Project)
	extendWriteDeadline(req.W, wait)
	if remote.Forward(req.W, req.R, req.Body, wait) {
		return Outcome{Caller: c, Forwarded: true}, nil
	}
	if isClosed(p.cfg.Stopping) {
		return Outcome{}, &Refusal{Kind: RefusedShuttingDown, Err: errStopping}
	}
	return Outcome{}, &Refusal{Kind: RefusedUnavailable, Err: ErrNoNode}
}

var errStopping = errors.New("inferd is shutting down; retry")

// extendWriteDeadline lets the answer to a request that waits up to wait
// be written until a minute after it: the server's write timeout is for
// short answers. Nothing for no writer or no wait.
func extendWriteDeadline(w http.ResponseWriter, wait time.Duration) {
	if w != nil && wait > 0 {
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + time.Minute))
	}
}

// Ended is why Await stopped waiting.
type Ended int

// Ends of a wait.
const (
	Finished   Ended = iota // the call is final
	WaitOver                // the wait ran out first
	ClientGone              // ctx ended: nobody reads the answer
	Stopping                // inferd shuts down
)

// Await waits until call id is final, wait has passed, ctx ends or inferd
// stops, and returns the call as it then stands (read again, within
// Config.Reread, once the wait ends). done is the call's completion signal
// (shared by every waiter), or nil to look it up. Only a lookup that fails
// before anything was seen is an error.
func (p *Pipeline) Await(ctx context.Context, call store.Call, done <-chan struct{}, wait time.Duration) (store.Call, Ended, error) {
	if call.State.Done() {
		return call, Finished, nil // final already (a sync start's): nothing to read
	}
	if done == nil {
		c, d, err := p.cfg.Sched.Lookup(call.ID)
		if err != nil {
			return call, Finished, err
		}
		call, done = c, d
	}
	if call.State.Done() {
		return call, Finished, nil
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	end := Finished
	select {
	case <-done:
	case <-t.C:
		end = WaitOver
	case <-ctx.Done():
		// The server's base context ends at shutdown too (Stopping is
		// closed then).
		if isClosed(p.cfg.Stopping) {
			return call, Stopping, nil
		}
		return call, ClientGone, nil
	case <-p.cfg.Stopping:
		return call, Stopping, nil
	}
	if c, ok := p.reread(call.ID); ok {
		call = c
	}
	if end == Finished && !call.State.Done() {
		end = WaitOver // the read could not tell: as it last stood
	}
	return call, end, nil
}

// reread reads call id again, within Config.Reread when set.
func (p *Pipeline) reread(id string) (store.Call, bool) {
	if p.cfg.Reread <= 0 {
		c, _, err := p.cfg.Sched.Lookup(id)
		return c, err == nil
	}
	type answer struct {
		c   store.Call
		err error
	}
	got := make(chan answer, 1) // buffered: the lookup never waits for a reader
	go func() {
		c, _, err := p.cfg.Sched.Lookup(id)
		got <- answer{c, err}
	}()
	t := time.NewTimer(p.cfg.Reread)
	defer t.Stop()
	select {
	case r := <-got:
		return r.c, r.err == nil
	case <-t.C:
		return store.Call{}, false
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
