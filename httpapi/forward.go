package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	stdlog "log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/cluster"
	"inferd/httpapi/respond"
	"inferd/scheduler"
	"inferd/store"
)

// Cluster mode in the public API (docs/cluster.md): a start or /run of a
// project placed on other nodes is forwarded to one of them, a cancel of a
// call pending on another node is forwarded to that node, and /cluster/v1/
// serves the requests between nodes. Every forward is signed with the
// cluster secret and carries the client's own headers and body, so the
// node that runs the call authenticates the client's key as usual.

// Routing is what the public API needs to route requests in cluster mode
// (Options.Routing); nil is the single box: nothing is forwarded and
// /cluster/v1/ does not exist.
type Routing struct {
	// Router says where a start runs (*cluster.Router).
	Router ClusterRouter
	// Signer signs forwarded requests and checks other nodes' requests.
	Signer *cluster.Signer
	// Fits reports whether this node could run a replica of p now (the
	// scheduler's fit rule, Scheduler.FitsNow); it is asked only for a
	// project with no placement yet. nil: it cannot.
	Fits func(p store.Project) bool
	// CallNode names the node that call id is pending on: "" once the call
	// is final (store/etcd's pending/<id>).
	CallNode func(id string) (string, error)
	// Nodes are the live nodes (this one included), whose parts of the
	// Batch API's lists a list gathers; nil: this node's alone.
	Nodes func() []cluster.NodeInfo
	// Transport carries forwarded requests; nil: one of its own (no
	// environment proxy, a short dial timeout).
	Transport http.RoundTripper

	// grace replaces forwardGrace in tests.
	grace        time.Duration
	routes       []clusterRoute
	ownOnce      sync.Once
	ownTransport http.RoundTripper
}

// forwardLimit is how long a forward waits for the answer of a request
// that waits up to wait on the other node.
func (c *Routing) forwardLimit(wait time.Duration) time.Duration {
	if c.grace > 0 {
		return wait + c.grace
	}
	return wait + forwardGrace
}

// transport is Transport, or the one of its own.
func (c *Routing) transport() http.RoundTripper {
	if c.Transport != nil {
		return c.Transport
	}
	c.ownOnce.Do(func() { c.ownTransport = newForwardTransport() })
	return c.ownTransport
}

// ClusterRouter chooses the node a start runs on (*cluster.Router).
type ClusterRouter interface {
	Route(ctx context.Context, project string, fitsHere func() bool) (cluster.Route, error)
	Node(name string) (cluster.NodeInfo, bool)
}

// clusterRoute is a handler under /cluster/v1/ (Routing.Handle).
type clusterRoute struct {
	method, path string
	h            http.Handler
}

// clusterPrefix is the path of the API between nodes.
const clusterPrefix = "/cluster/v1/"

// Handle serves h at method and /cluster/v1/ + path (httprouter syntax,
// e.g. "payloads/:id/:kind"; h reads the parameters with
// httprouter.ParamsFromContext). Only requests signed by a node of the
// cluster reach h (ClusterPeer names that node); others are answered 401.
// Call it before New.
func (c *Routing) Handle(method, path string, h http.Handler) {
	c.routes = append(c.routes, clusterRoute{method, clusterPrefix + strings.TrimPrefix(path, "/"), h})
}

// forwardDialTimeout bounds the connection to another node: a node that
// cannot be reached within it is skipped for the next placed node.
const forwardDialTimeout = 2 * time.Second

// newForwardTransport is the transport of forwards: nodes reach each other
// directly, never through a proxy named in the environment, and keep enough
// idle connections for a busy node's forwards.
func newForwardTransport() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.Proxy = nil
	t.DialContext = (&net.Dialer{Timeout: forwardDialTimeout, KeepAlive: 30 * time.Second}).DialContext
	t.MaxIdleConnsPerHost = 64
	return t
}

// Cluster-mode failures.
var (
	// errClusterUnavailable: no node can take the request now (no live
	// placed node, or none reached); the client's retry may find one.
	errClusterUnavailable = &userError{http.StatusServiceUnavailable, codeUnavailable, clusterUnavailable}
	// errForwardUnsigned: a request marked as forwarded by a node that
	// does not verify. It is refused rather than routed again, which could
	// bounce it between nodes whose clocks disagree.
	errForwardUnsigned = &userError{http.StatusUnauthorized, codeUnauthorized,
		"forwarded request not signed by a node of this cluster"}
)

// failRouted answers an inference request that was not run here for err:
// no node could take it is a 503 with the usual answer, as etcd not
// answering is; anything else as fail does.
func (a *api) failRouted(w http.ResponseWriter, r *http.Request, err error) {
	if errors.Is(err, errClusterUnavailable) {
		a.writeInferenceStatus(w, http.StatusServiceUnavailable, a.newResponse("error: "+errClusterUnavailable.msg, ""))
		return
	}
	a.fail(w, r, err)
}

// forwarded reports whether r comes from another node of the cluster
// (ForwardedHeader with a valid signature): it then runs here, whatever
// this node's placement says. Asked in cluster mode only (forwarder): on a
// single box the header means nothing.
func (a *api) forwarded(r *http.Request) (bool, error) {
	if r.Header.Get(cluster.ForwardedHeader) == "" {
		return false, nil
	}
	if _, err := a.opts.Routing.Signer.Verify(r); err != nil {
		// Logged here, as the answer goes back through the forwarding
		// node to the client: the operator learns of a clock off by more
		// than the signature allows, or a node with another secret.
		a.log.Warn().Err(err).Str("from", truncate(r.Header.Get(cluster.ForwardedHeader), 64)).
			Str("path", truncate(r.URL.Path, 200)).Msg("refused a forwarded request")
		return false, fmt.Errorf("%w: %w", errForwardUnsigned, err)
	}
	return true, nil
}

// fromNode reports, without logging, whether r carries a valid signature of
// a node of the cluster (forwarded answers the request that does not).
func (a *api) fromNode(r *http.Request) bool {
	if a.opts.Routing == nil || r.Header.Get(cluster.ForwardedHeader) == "" {
		return false
	}
	_, err := a.opts.Routing.Signer.Verify(r)
	return err == nil
}

// startNodes says where a start (or /run) of p goes in cluster mode
// (forwarder): nil runs it here; otherwise the nodes to forward it to, best
// first.
func (a *api) startNodes(r *http.Request, p store.Project) ([]cluster.NodeInfo, error) {
	if fwd, err := a.forwarded(r); fwd || err != nil {
		return nil, err
	}
	rt, err := a.opts.Routing.Router.Route(r.Context(), p.ID, a.fitsHere(p))
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errClusterUnavailable, err)
	}
	if rt.Local {
		return nil, nil
	}
	return rt.Nodes, nil
}

// fitsHere is the Router's check that p fits on this node, or nil. Apart
// from startNodes, so that p is copied to the heap only in cluster mode:
// a closure over startNodes' own p moved it there on every start.
func (a *api) fitsHere(p store.Project) func() bool {
	if a.opts.Routing.Fits == nil {
		return nil
	}
	held := p // what goes to the heap, here and not at the caller's entry
	return func() bool { return a.opts.Routing.Fits(held) }
}

// callNode says where a cancel of call c goes in cluster mode
// (forwarder): nil here; otherwise the node it is pending on.
func (a *api) callNode(r *http.Request, c store.Call) ([]cluster.NodeInfo, error) {
	if c.State.Done() {
		return nil, nil
	}
	if fwd, err := a.forwarded(r); fwd || err != nil {
		return nil, err
	}
	n, elsewhere, err := a.opts.Routing.pendingOn(c.ID)
	if !elsewhere || err != nil {
		return nil, err
	}
	return []cluster.NodeInfo{n}, nil
}

// pendingOn returns the other node that call id is pending on, if it is.
func (c *Routing) pendingOn(id string) (n cluster.NodeInfo, elsewhere bool, err error) {
	name, err := c.CallNode(id)
	if err != nil {
		return n, false, fmt.Errorf("find the node of call %s: %w", id, err)
	}
	if name == "" || name == c.Signer.Node() {
		return n, false, nil
	}
	n, ok := c.Router.Node(name)
	if !ok {
		// Its lease ended: the leader hands its calls to others, and a
		// retry finds the call there.
		return n, false, fmt.Errorf("%w: call %s is on node %s, which is not live", errClusterUnavailable, id, name)
	}
	return n, true, nil
}

// forwardGrace is what a forward allows beyond the wait of the request on
// the other node (StartWait for a start or cancel) before it gives up on
// an answer: that node may have been cut off after it got the request.
const forwardGrace = 30 * time.Second

// forward sends r, whose body was read as body, to the first of nodes that
// it reaches, and passes that node's answer on as it comes, waiting at
// most limit for it. It reports false when it wrote nothing: no node was
// reached, or the one reached failed before answering. A node that the
// request may have reached is never followed by another, which could run
// the start twice.
func (a *api) forward(w http.ResponseWriter, r *http.Request, body []byte, nodes []cluster.NodeInfo, limit time.Duration) bool {
	client := r.Context()
	ctx, cancel := context.WithTimeout(client, limit)
	defer cancel()
	r = r.WithContext(ctx)
	for _, n := range nodes {
		reached, err := a.forwardTo(w, r, body, n)
		if err == nil {
			return true
		}
		if client.Err() != nil {
			return false // the client is gone (or the server stops)
		}
		a.log.Warn().Err(err).Str("node", n.Name).Bool("reached", reached).
			Str("request_id", requestIDOf(w)).Str("path", truncate(r.URL.Path, 200)).Msg("forward to another node failed")
		if reached {
			return false
		}
	}
	return false
}

// forwardTo proxies r to node n: the client's headers and body, signed as
// forwarded by this node. reached reports whether the request's headers
// were written to n (then it may have acted on it).
func (a *api) forwardTo(w http.ResponseWriter, r *http.Request, body []byte, n cluster.NodeInfo) (reached bool, err error) {
	target, err := url.Parse(n.Advertise)
	if err != nil || target.Host == "" || (target.Scheme != "http" && target.Scheme != "https") {
		return false, fmt.Errorf("node %s advertises %q, not an http(s) URL", n.Name, n.Advertise)
	}
	var wrote atomic.Bool // set on the transport's goroutine
	trace := &httptrace.ClientTrace{WroteHeaders: func() { wrote.Store(true) }}
	in := r.Clone(httptrace.WithClientTrace(r.Context(), trace))
	in.Body = io.NopCloser(bytes.NewReader(body))
	in.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(body)), nil }
	in.ContentLength, in.TransferEncoding = int64(len(body)), nil
	requestID := requestIDOf(w)
	var failed error
	proxy := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
			pr.Out.Header.Set(requestIDHeader, requestID) // one id in both nodes' logs
			pr.Out.Header.Set(cluster.ForwardedHeader, a.opts.Routing.Signer.Node())
			a.opts.Routing.Signer.Sign(pr.Out)
		},
		Transport: a.opts.Routing.transport(),
		ModifyResponse: func(resp *http.Response) error {
			resp.Header.Del(requestIDHeader) // this node's answer already has it
			return nil
		},
		// Nothing is written on failure: the caller tries the next node or
		// answers in its endpoint's own shape.
		ErrorHandler: func(_ http.ResponseWriter, _ *http.Request, err error) { failed = err },
		ErrorLog:     stdlog.New(a.log, "forward: ", 0),
	}
	proxy.ServeHTTP(w, in)
	if failed != nil {
		return wrote.Load(), fmt.Errorf("forward %s %s to node %s: %w", r.Method, r.URL.Path, n.Name, failed)
	}
	return true, nil
}

// peerKey is the context key of the node that signed a /cluster/v1/
// request.
type peerKey struct{}

// ClusterPeer names the node that signed r, for the handlers given to
// Routing.Handle; "" for any other request.
func ClusterPeer(r *http.Request) string {
	name, _ := r.Context().Value(peerKey{}).(string)
	return name
}

// clusterMethods are the methods /cluster/v1/ answers: every request,
// whatever its route, is verified before the sub-router sees it, so an
// unsigned caller learns nothing of what exists there.
var clusterMethods = []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete}

// clusterAPI returns the handler of /cluster/v1/*: the signature check in
// front of the routes given to Routing.Handle.
func (a *api) clusterAPI() httprouter.Handle {
	sub := newRouter(a.recoverPanic)
	sub.POST(clusterPrefix+"calls/:id/cancel", a.clusterCancel)
	sub.POST(operatorCallPath, a.operatorCall) // operator.go
	// openai_batches_cluster.go: a node's part of a Batch API list.
	sub.POST(batchListPath, a.clusterBatchList)
	for _, rt := range a.opts.Routing.routes {
		sub.Handler(rt.method, rt.path, rt.h)
	}
	return func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
		node, err := a.opts.Routing.Signer.Verify(r)
		if err != nil {
			a.log.Warn().Err(err).Str("request_id", requestIDOf(w)).Str("path", truncate(r.URL.Path, 200)).
				Msg("refused a request between nodes")
			writeJSON(w, http.StatusUnauthorized, respond.Refusal(codeUnauthorized, cluster.ErrUnauthenticated.Error()))
			return
		}
		sub.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), peerKey{}, node)))
	}
}

// clusterCancel handles POST /cluster/v1/calls/:id/cancel: another node's
// admin API cancels a call that this node runs (Routing.Canceller). It
// answers as the admin API's cancel does.
func (a *api) clusterCancel(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	c, err := a.sched.Cancel(id)
	respond.WriteCancelled(w, r, a.log, id, c, err)
}

// remoteCancelTimeout bounds a cancel on another node: a running call's
// cancel waits there until its replica lets go of it (replica.stopGrace).
const remoteCancelTimeout = 2 * time.Minute

// Canceller returns the admin API's cancel (admin.CallCanceller) in
// cluster mode: local for a call of this node's (or a final one), and for
// a call pending on another node that node's, over /cluster/v1/.
func (c *Routing) Canceller(local func(id string) (store.Call, error)) func(id string) (store.Call, error) {
	return func(id string) (store.Call, error) {
		n, elsewhere, err := c.pendingOn(id)
		switch {
		case err != nil:
			return store.Call{}, err
		case elsewhere:
			return c.cancelOn(n, id)
		default:
			return local(id)
		}
	}
}

// cancelOn cancels call id on node n, with the errors a local cancel has.
func (c *Routing) cancelOn(n cluster.NodeInfo, id string) (store.Call, error) {
	ctx, cancel := context.WithTimeout(context.Background(), remoteCancelTimeout)
	defer cancel()
	u := strings.TrimSuffix(n.Advertise, "/") + clusterPrefix + "calls/" + url.PathEscape(id) + "/cancel"
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u, nil)
	if err != nil {
		return store.Call{}, fmt.Errorf("cancel call %s on node %s: %w", id, n.Name, err)
	}
	c.Signer.Sign(req)
	resp, err := (&http.Client{Transport: c.transport()}).Do(req)
	if err != nil {
		return store.Call{}, fmt.Errorf("%w: cancel call %s on node %s: %w", errClusterUnavailable, id, n.Name, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
	if err != nil {
		return store.Call{}, fmt.Errorf("%w: cancel call %s on node %s: %w", errClusterUnavailable, id, n.Name, err)
	}
	var ok respond.Cancelled
	var failed errorBody
	switch {
	case resp.StatusCode == http.StatusOK && json.Unmarshal(body, &ok) == nil:
		return store.Call{ID: ok.ID, ProjectID: ok.Project, State: ok.State, Message: ok.Message}, nil
	case resp.StatusCode == http.StatusNotFound:
		return store.Call{}, fmt.Errorf("call %s on node %s: %w", id, n.Name, store.ErrNotFound)
	case resp.StatusCode == http.StatusConflict && json.Unmarshal(body, &failed) == nil:
		// The message is the finished error's own text ("call already
		// finished (succeeded)").
		return store.Call{}, fmt.Errorf("%w%s", scheduler.ErrFinished, strings.TrimPrefix(failed.Error.Message, scheduler.ErrFinished.Error()))
	default:
		return store.Call{}, fmt.Errorf("cancel call %s on node %s: HTTP %d: %s", id, n.Name, resp.StatusCode, truncate(string(body), 200))
	}
}
