package httpapi

import (
	"errors"
	"net/http"
	"time"

	"inferd/cluster"
	"inferd/pipeline"
	"inferd/store"
)

// The doors' side of the one call path (package pipeline): the admission
// hooks made of the API's limits, the placer (local, or the cluster's
// forwarder), and what each door's refusals read as. Each door
// (inference.go, run.go, openai_calls.go) decodes its request into a
// pipeline.Request and renders the outcome; none of them looks at the
// cluster or the limits itself.

// Names of the admission hooks, each its config key: the counter of its
// refusals (inferd_admission_refusals_total) is labelled with it.
const (
	hookRate    = "limits.requestsPerSecond"
	hookWaits   = "limits.maxWaitsPerKey"
	hookStreams = budgetStreamsPerKey
)

// newPipeline makes the API's call path.
func (a *api) newPipeline() *pipeline.Pipeline {
	reread := time.Duration(0) // a single box reads its own bbolt file
	if a.opts.Cluster != nil || a.opts.Routing != nil {
		reread = rereadWithin
	}
	p := pipeline.New(pipeline.Config{
		Store:       a.store,
		StartLookup: a.opts.StartLookup,
		Sched:       a.sched,
		Place:       a.place,
		KeyHooks:    []pipeline.Hook{{Name: hookRate, Admit: a.admitRate}},
		CallHooks:   []pipeline.Hook{{Name: hookWaits, Admit: a.admitWait}, {Name: hookStreams, Admit: a.admitStream}},
		Stopping:    a.opts.Stopping,
		Reread:      reread,
		OnRefusal:   a.admissionRefused,
	})
	a.opts.Metrics.SetHooks(p)
	a.store.OnProjectChange(p.ProjectChanged)
	return p
}

// admissionRefused counts a refusal by an admission hook, and by the
// budget it names when it is one of the edge's (a key's streams).
func (a *api) admissionRefused(hook string, err error) {
	a.opts.Metrics.AdmissionRefused(hook)
	if be, ok := err.(*budgetError); ok {
		a.refused(be.budget)
	}
}

// rereadWithin bounds the read of a call at the end of a wait (cluster
// mode): past it, the wait answers the state it last saw rather than wait
// for an etcd that does not answer.
const rereadWithin = time.Second

// admitRate takes one request from the key's rate.
func (a *api) admitRate(ad *pipeline.Admission) (func(), error) {
	if ad.FromNode {
		return nil, nil // spent on the node the client sent it to
	}
	return nil, a.limits.allow(ad.Key.ID)
}

// admitWait takes one of the key's held-open waits for a request that
// waits for its call. A Banana start over the cap is admitted holding
// nothing and answered at once with its call's state (MayDegrade): an
// "error:" there would tell the client that a call which will run has
// failed.
func (a *api) admitWait(ad *pipeline.Admission) (func(), error) {
	if ad.Hold != pipeline.HoldWait {
		return nil, nil
	}
	release, ok := a.limits.beginWait(ad.Key.ID)
	switch {
	case ok:
		return release, nil
	case ad.MayDegrade:
		ad.Hold = pipeline.HoldNone
		return nil, nil
	}
	return nil, errWaitsPerKey
}

// errWaitsPerKey refuses a request that would wait past its key's (or the
// server's) cap of held-open requests.
var errWaitsPerKey = &userError{http.StatusTooManyRequests, codeRateLimited,
	"too many requests of this API key are waiting (" + hookWaits + "); retry later"}

// admitStream takes one of the key's event streams (and a wait) for a
// streaming request.
func (a *api) admitStream(ad *pipeline.Admission) (func(), error) {
	if ad.Hold != pipeline.HoldStream {
		return nil, nil
	}
	return a.limits.beginStream(ad.Key.ID)
}

// dialect is how a door words the end of its wait (awaitAnswer): a
// failure after the call was made, a shutdown cutting its wait, and the
// call as it stands. A new door is a decoder and a renderer: a dialect,
// and its words for the call path's refusals (each door's refused).
type dialect interface {
	failed(w http.ResponseWriter, r *http.Request, err error)
	stopping(w http.ResponseWriter, r *http.Request)
	answer(w http.ResponseWriter, r *http.Request, c store.Call)
}

// awaitAnswer waits up to wait for out's call (pipeline.Await) and answers
// it in d's words; a client that went away reads nothing, and the call
// runs on.
func (a *api) awaitAnswer(w http.ResponseWriter, r *http.Request, d dialect, out pipeline.Outcome, wait time.Duration) {
	extendWriteDeadline(w, wait)
	call, end, err := a.pipe.Await(r.Context(), out.Call, nil, wait)
	switch {
	case err != nil:
		d.failed(w, r, err)
	case end == pipeline.Stopping:
		d.stopping(w, r)
	case end != pipeline.ClientGone:
		d.answer(w, r, call)
	}
}

// extendWriteDeadline lets an answer that waits on its call be written up
// to a minute after wait: the server's write timeout is for the short
// waits of start and check.
func extendWriteDeadline(w http.ResponseWriter, wait time.Duration) {
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + time.Minute))
}

// placer is where a call runs, and where a cancel of a call goes: here on
// one box (localPlacer), the node that runs it in cluster mode
// (forwarder).
type placer interface {
	pipeline.Placer
	// PlaceCall returns the Remote that a cancel of call c goes to, or
	// nil to cancel it here.
	PlaceCall(r *http.Request, c store.Call) (pipeline.Remote, error)
}

// localPlacer is the single box: everything runs here.
type localPlacer struct{ pipeline.Local }

func (localPlacer) PlaceCall(*http.Request, store.Call) (pipeline.Remote, error) { return nil, nil }

// forwarder places calls on the nodes of the cluster (forward.go).
type forwarder struct{ a *api }

func (f forwarder) Place(r *http.Request, p store.Project) (pipeline.Remote, error) {
	nodes, err := f.a.startNodes(r, p)
	if nodes == nil || err != nil {
		return nil, err
	}
	return remoteNodes{f.a, nodes}, nil
}

func (f forwarder) PlaceCall(r *http.Request, c store.Call) (pipeline.Remote, error) {
	nodes, err := f.a.callNode(r, c)
	if nodes == nil || err != nil {
		return nil, err
	}
	return remoteNodes{f.a, nodes}, nil
}

// remoteNodes forwards to the first of its nodes that takes the request.
type remoteNodes struct {
	a     *api
	nodes []cluster.NodeInfo
}

func (n remoteNodes) Forward(w http.ResponseWriter, r *http.Request, body []byte, wait time.Duration) bool {
	return n.a.forward(w, r, body, n.nodes, n.a.opts.Routing.forwardLimit(wait))
}

// refusalError is what a refusal of the pipeline reads as, in the words
// every door shares: the user-facing errors that fail (Banana), runRefused
// (/run) and openaiError turn into their own shapes. invalidKey and
// noProject are the door's own answers to an unknown key and a project the
// key may not reach.
func refusalError(ref *pipeline.Refusal, invalidKey, noProject error) error {
	switch ref.Kind {
	case pipeline.RefusedKey:
		return invalidKey
	case pipeline.RefusedKeyExpired:
		return errKeyExpired
	case pipeline.RefusedScope:
		return requirePermission(ref.Key, store.PermInfer)
	case pipeline.RefusedProject:
		return noProject
	case pipeline.RefusedUnavailable:
		if errors.Is(ref.Err, pipeline.ErrNoNode) {
			return errClusterUnavailable
		}
		return ref.Err
	case pipeline.RefusedBudget, pipeline.RefusedRequest, pipeline.RefusedPlace, pipeline.RefusedShuttingDown,
		pipeline.RefusedInternal, pipeline.RefusedStorageFull:
		return ref.Err
	default:
		// The scheduler's refusals (queue full, needs GPUs, ...) are texts
		// written for users; a store error underneath is mapped as any.
		return &schedulerError{ref.Err}
	}
}
