package httpapi

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/rs/zerolog"

	"inferd/batches"
	"inferd/httpapi/metrics"
	"inferd/httpapi/respond"
	"inferd/httpapi/status"
	"inferd/httpapi/usage"
	"inferd/openai"
	"inferd/pipeline"
	"inferd/store"
	"inferd/webhook"
)

// DefaultAPIVersion is the apiVersion of answers when Options sets none.
// The other zero values of Options take the call path's defaults
// (pipeline.DefaultStartWait and the rest).
const DefaultAPIVersion = "inferd"

// Options configures the public API handler. Zero values take the defaults.
type Options struct {
	// StartWait is how long a Start without startOnly waits for the result
	// before answering with the callID (default 50s).
	StartWait time.Duration
	// LongPollWait is how long a Check with longPoll waits for the result
	// (default 50s).
	LongPollWait time.Duration
	// MaxBodyBytes caps every request body (default 10 MiB).
	MaxBodyBytes int64
	// APIVersion is the apiVersion of inference responses, e.g. "inferd/0.1.0".
	APIVersion string
	// Log receives one access line per request and internal errors.
	Log zerolog.Logger
	// Metrics, when set, counts requests by route and status and is served
	// at GET /metrics (no API key; see metrics.Metrics.Serve).
	Metrics *metrics.Metrics
	// Status, when set, feeds the /v1/status endpoints and the status page
	// at GET / (package httpapi/status).
	Status *status.Sources
	// Limits caps request rates, held-open waits and input nesting per API
	// key; unlike the fields above, a zero field means no limit.
	Limits Limits
	// Routing, in cluster mode, forwards starts and cancels to the nodes
	// that run them and serves /cluster/v1/ (forward.go); nil: a single
	// box.
	Routing *Routing
	// RateNodes, in cluster mode, is how many live nodes share each key's
	// request rate (limits.requestsPerSecond and burst are the cluster's):
	// this node allows its part. Nil: a single box, the whole rate here.
	RateNodes func() int
	// StartLookup, when set, reads a start's API key and the project of
	// its modelKey together (store/etcd's LookupStart: one round trip to
	// etcd instead of three); nil: Authenticate, then ProjectByModelKey.
	StartLookup func(secret, modelKey string) store.StartLookup
	// Streams carries running calls' events to GET /v1/calls/:callID/events
	// (the scheduler's OutputSink); nil: the events show states and done
	// only.
	Streams *Streams
	// Stopping, when closed, ends the requests that wait on a call without
	// bound of their own (event streams, /run), so that they never hold a
	// shutdown up: the server's RegisterOnShutdown closes it.
	Stopping <-chan struct{}
	// WebhookPolicy says which webhook destinations a start may name; nil
	// is the default policy (all but link-local and cloud metadata).
	WebhookPolicy *webhook.Policy
	// Cluster, in cluster mode, is this node's view of the cluster: the
	// cluster section of /v1/status (httpapi/status). Nil on a single box.
	Cluster status.ClusterView
	// OpenAIQueueWait is how long a request of the OpenAI routes waits for
	// a ready replica (a boot from zero included) before it is answered
	// 503 and its call expires (default 5 minutes; see openai.go).
	OpenAIQueueWait time.Duration
	// Batches, when set, serves the OpenAI Batch API (/v1/files,
	// /v1/batches; openai_batches.go); BatchFileBytes bounds an upload.
	Batches        BatchAPI
	BatchFileBytes int64
}

func (o Options) withDefaults() Options {
	if o.StartWait <= 0 {
		o.StartWait = pipeline.DefaultStartWait
	}
	if o.LongPollWait <= 0 {
		o.LongPollWait = pipeline.DefaultLongPollWait
	}
	if o.MaxBodyBytes <= 0 {
		o.MaxBodyBytes = pipeline.DefaultMaxBodyBytes
	}
	if o.BatchFileBytes <= 0 {
		o.BatchFileBytes = batches.DefaultMaxFileBytes
	}
	if o.OpenAIQueueWait <= 0 {
		o.OpenAIQueueWait = pipeline.DefaultOpenAIQueueWait
	}
	if o.APIVersion == "" {
		o.APIVersion = DefaultAPIVersion
	}
	if o.Streams == nil {
		o.Streams = NewStreams()
	}
	if o.WebhookPolicy == nil {
		o.WebhookPolicy = &webhook.Policy{}
	}
	return o
}

// Store is what the public API needs from a store.Store: what the call
// path reads (pipeline.Store) and what the project API and the usage
// report do.
type Store interface {
	pipeline.Store
	// OnProjectChange tells the call path of every project change: it
	// keeps the OpenAI model names until one (pipeline.ProjectChanged).
	OnProjectChange(fn func(projectID string))
	UpdateProject(id string, fn func(*store.Project) error) (store.Project, error)
	GetTeam(id string) (store.Team, error) // its quota bounds a PUT
	usage.Reader                           // GET /v1/usage (usage.go)
}

// Scheduler is what the public API needs from the scheduler.
type Scheduler interface {
	// Start and Lookup, the call path's (pipeline.Scheduler): Start's
	// errors are user-facing texts (queue full, not enough GPUs,
	// idempotencyKey reused) or store errors; Lookup's channel closes
	// once the call's final result is durable, and an unknown or expired
	// id is store.ErrNotFound.
	pipeline.Scheduler
	// Cancel ends a queued or running call and returns it once that is
	// durable; a finished call is an error wrapping scheduler.ErrFinished.
	Cancel(id string) (store.Call, error)
	// Disconnected ends a call as Cancel does, for a client that went
	// away while it alone held the answer open: it reads "cancelled: the
	// client disconnected", not "cancelled by request".
	Disconnected(id string) (store.Call, error)
	// Purge cancels the calls waiting in a project's queue and says how
	// many.
	Purge(projectID string) (int, error)
	// Warmup boots a project's replica and returns once one is ready, with
	// the boot's failure, or when ctx ends.
	Warmup(ctx context.Context, p store.Project) error
	// Ready reports whether the scheduler is running.
	Ready() bool
}

// api holds the dependencies of the public handlers.
type api struct {
	opts   Options
	log    zerolog.Logger
	store  Store
	sched  Scheduler
	limits *limiter
	// pipe is the one call path of every door; place is where its calls
	// (and their cancels) go (callpath.go).
	pipe  *pipeline.Pipeline
	place placer
	// The budgets of the edge (budgets.go): the bytes of bodies being
	// read, the results held for event streams, and the streams open.
	bodies      *bodyBudget
	results     *streamResults
	streamsOpen atomic.Int64
}

// Server is the public HTTP API (an http.Handler), and the doors onto its
// call path that other servers serve (OperatorCalls).
type Server struct {
	http.Handler
	a *api
}

// New returns the public HTTP API: the inference endpoints, the project API
// and the health probes, wrapped in request-id and access-log middleware.
func New(opts Options, st Store, sched Scheduler) *Server {
	opts = opts.withDefaults()
	a := &api{opts: opts, log: opts.Log, store: st, sched: sched, limits: newLimiter(opts.Limits, opts.RateNodes),
		bodies:  newBodyBudget(opts.Limits.BodyBytes, opts.Limits.BodyBytesPerSource),
		results: newStreamResults(opts.Limits.StreamResultBytes), place: localPlacer{}}
	if opts.Routing != nil {
		a.place = forwarder{a} // cluster mode: calls may run on other nodes
	}
	a.pipe = a.newPipeline()
	opts.Metrics.SetEdge(a.edgeStats, budgetNames)

	r := newRouter(a.recoverPanic)
	for _, rt := range a.routes() {
		r.Handle(rt.Method, rt.Path, routed(rt.Path, rt.handle))
	}
	return &Server{Handler: withRequestLog(opts.Metrics.CountRequests(a.withEdge(r)), opts.Log), a: a}
}

// edgeStats is what the edge's budgets hold now, for the metrics.
func (a *api) edgeStats() metrics.EdgeStats {
	return metrics.EdgeStats{BodyBytes: a.bodies.inUse(), Streams: a.streamsOpen.Load(), StreamResultBytes: a.results.inUse()}
}

// routed records the route pattern of the request for the request counter:
// the pattern, not the raw path, keeps the metric's label set bounded.
func routed(pattern string, h httprouter.Handle) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
		if rec, ok := w.(*respond.Recorder); ok {
			rec.SetRoute(pattern)
		}
		h(w, r, ps)
	}
}

// routeError answers a request no route takes: in OpenAI's shape on the
// OpenAI routes' paths (the SDKs read only that), else the project API's.
func routeError(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	if isOpenAIPath(r.URL.Path) {
		writeJSON(w, status, openai.NewError(openai.TypeInvalidRequest, code, "", msg))
		return
	}
	writeJSON(w, status, respond.Refusal(code, msg))
}

// recoverPanic answers a handler panic: the inference endpoints keep their
// promise of HTTP 200 with an "error:" message, the others answer JSON 500.
func (a *api) recoverPanic(w http.ResponseWriter, r *http.Request, v any) {
	if !logPanic(w, r, a.log, v) {
		return
	}
	if isInferencePath(r.URL.Path) {
		a.writeInference(w, a.newResponse("error: internal error", ""))
		return
	}
	if isOpenAIPath(r.URL.Path) {
		a.openaiError(w, r, &oaiError{status: http.StatusInternalServerError, typ: "server_error", code: codeInternal,
			msg: "internal error; see the server log for request id " + requestIDOf(w)})
		return
	}
	writeJSON(w, http.StatusInternalServerError, respond.Refusal(codeInternal,
		"internal error; see the server log for request id "+requestIDOf(w)))
}

// isOpenAIPath reports whether p is a route of the OpenAI front door,
// whose errors have OpenAI's shape (openai.go).
func isOpenAIPath(p string) bool {
	for _, prefix := range []string{"/v1/chat/", "/v1/completions", "/v1/embeddings", "/v1/models", "/v1/files", "/v1/batches"} {
		if strings.HasPrefix(p, prefix) {
			return true
		}
	}
	return strings.HasPrefix(p, "/v1/calls/") && strings.HasSuffix(p, "/response")
}

func isInferencePath(p string) bool {
	return strings.HasPrefix(p, "/start/") || strings.HasPrefix(p, "/check/") || strings.HasPrefix(p, "/cancel/")
}

func (a *api) healthz(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	writeJSON(w, http.StatusOK, statusBody{"ok"})
}

// readyz reports ready once the scheduler runs; the scheduler only runs on
// an open store.
func (a *api) readyz(w http.ResponseWriter, _ *http.Request, _ httprouter.Params) {
	if !a.sched.Ready() {
		writeJSON(w, http.StatusServiceUnavailable, statusBody{"not ready"})
		return
	}
	writeJSON(w, http.StatusOK, statusBody{"ready"})
}

type statusBody struct {
	Status string `json:"status"`
}
