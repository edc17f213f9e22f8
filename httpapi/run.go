package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/cluster"
	"inferd/scheduler"
	"inferd/store"
)

// The Banana Client routes: banana_dev's Client(api_key, url).call(route,
// json) (Python 5.x/6.x, JavaScript 6.x) POSTs straight to a route of the
// project's Potassium app. Its base URL for a project is
// http://HOST:PORT/run/PROJECT. The SDK retries 400, 423 and 503 with the
// same X-Banana-Request-Id and gives up on 401, 404, 413 and 500, so the
// status codes here are chosen for what it does with them: a request that
// can never succeed is never 400, 423 or 503.

// Headers of the Banana Client routes.
const (
	bananaRequestIDHeader = "X-Banana-Request-Id"
	callIDHeader          = "X-Inferd-Call-Id"
	// maxRouteLen bounds a route.
	maxRouteLen = 256
)

// runError answers a /run request that did not reach the model's answer:
// status and a JSON error body, as the project API's.
func runError(w http.ResponseWriter, status int, code, msg string) {
	writeJSON(w, status, errorBody{errorDetail{code, msg}})
}

// run handles POST /run/:project/*route: the call goes to that route of the
// project's model, and the answer is the model's JSON (200), or the
// handler's error text (500). It is a durable call like any other (the
// X-Inferd-Call-Id header names it for check), made once per
// X-Banana-Request-Id.
func (a *api) run(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	// Calls and warm-ups need infer, as start and POST /warmup/v4 do.
	key, err := a.headerKeyFor(r, store.PermInfer)
	if err != nil {
		a.runRefused(w, r, err)
		return
	}
	project, err := a.store.GetProject(ps.ByName("project"))
	if errors.Is(err, store.ErrNotFound) || err == nil && !mayReach(key, project.TeamID, project.ID) {
		// Another team's project, or one outside the key's allowlist,
		// answers as a missing one.
		runError(w, http.StatusNotFound, codeNotFound, "project not found")
		return
	}
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	route, ok := cleanRoute(ps.ByName("route"))
	if !ok {
		runError(w, http.StatusNotFound, codeNotFound, "no such route: "+truncate(ps.ByName("route"), 100))
		return
	}
	body, err := a.readBody(w, r, a.opts.MaxBodyBytes)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		runError(w, http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body is larger than %d bytes", tooLarge.Limit))
		return
	case err != nil:
		a.runRefused(w, r, err) // a budget's 429 is a 503 here, which the SDK retries
		return
	}
	inputs := json.RawMessage(bytes.TrimSpace(body))
	if len(inputs) == 0 {
		inputs = json.RawMessage("{}")
	}
	if !json.Valid(inputs) {
		// 422, not 400: the SDK would retry a 400 for five minutes.
		runError(w, http.StatusUnprocessableEntity, "unprocessable", "request body is not valid JSON")
		return
	}
	req := scheduler.Request{Inputs: inputs, Route: route, IdempotencyKey: r.Header.Get(bananaRequestIDHeader)}
	if len(req.IdempotencyKey) > store.MaxIdempotencyKeyLen {
		runError(w, http.StatusUnprocessableEntity, "unprocessable",
			fmt.Sprintf("%s is longer than %d bytes", bananaRequestIDHeader, store.MaxIdempotencyKeyLen))
		return
	}
	// In cluster mode a project placed on other nodes runs there.
	nodes, err := a.startNodes(r, project)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	if nodes != nil {
		a.runForward(w, r, body, nodes, project)
		return
	}
	call, done, err := a.runCall(r.Context(), project, req)
	if err != nil {
		a.runFailed(w, r, err)
		return
	}
	w.Header().Set(callIDHeader, call.ID)
	if !isClosed(done) {
		wait := time.Duration(project.InferenceTimeout) * time.Second
		// The server's write timeout is for the short waits of start and
		// check; this one may be as long as the project allows.
		_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + time.Minute))
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-done:
		case <-t.C:
		case <-r.Context().Done():
			// The server's base context ends at shutdown too (Stopping is
			// closed then): answer that; a client that went away reads
			// nothing, and the call runs on.
			if isClosed(a.opts.Stopping) {
				errShuttingDown(w)
			}
			return
		case <-a.opts.Stopping:
			errShuttingDown(w)
			return
		}
		if c, _, err := a.sched.Lookup(call.ID); err == nil {
			call = c
		}
	}
	a.runAnswer(w, call)
}

// runForward passes a /run request to another node and its answer back,
// which may take as long as the project's inferenceTimeout.
func (a *api) runForward(w http.ResponseWriter, r *http.Request, body []byte, nodes []cluster.NodeInfo, p store.Project) {
	wait := time.Duration(p.InferenceTimeout) * time.Second
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + time.Minute))
	switch {
	case a.forward(w, r, body, nodes, a.opts.Routing.forwardLimit(wait)):
	case isClosed(a.opts.Stopping):
		errShuttingDown(w)
	default:
		writeError(w, r, a.log, errClusterUnavailable)
	}
}

// runRefused answers a request its key may not make. The SDK shows the
// body of a 401 but not of a 403 ("Unexpected HTTP response code"), so a
// key's missing scope is a 401 here; a key over its request rate (or an
// address over its body budget) is a 503, which the SDK retries.
func (a *api) runRefused(w http.ResponseWriter, r *http.Request, err error) {
	var ue *userError
	switch {
	case errors.As(err, &ue) && ue.status == http.StatusTooManyRequests:
		runError(w, http.StatusServiceUnavailable, ue.code, ue.msg)
	case errors.As(err, &ue) && ue.status == http.StatusForbidden:
		runError(w, http.StatusUnauthorized, ue.code, ue.msg)
	default:
		writeError(w, r, a.log, err)
	}
}

// runCall admits the call, durable before it runs, or finds the one an
// earlier request with the same idempotency key made (the scheduler's
// idempotent start), so that a retry of the SDK never runs the model twice.
func (a *api) runCall(ctx context.Context, p store.Project, req scheduler.Request) (store.Call, <-chan struct{}, error) {
	// Admitted and durable before the wait (no req.Wait): the call belongs
	// to the server once admitted, and a retry finds it by its key.
	c, err := a.sched.Start(context.WithoutCancel(ctx), p, req)
	switch {
	case errors.Is(err, scheduler.ErrIdempotencyMismatch):
		return store.Call{}, nil, errRequestIDReused
	case err != nil:
		return store.Call{}, nil, &schedulerError{err}
	case c.Route != req.Route:
		return store.Call{}, nil, errRequestIDReused
	}
	return a.sched.Lookup(c.ID)
}

// errShuttingDown answers a /run wait cut short by a shutdown: the SDK
// retries a 503, and its retry finds the call by its request id once the
// daemon is back.
func errShuttingDown(w http.ResponseWriter) {
	runError(w, http.StatusServiceUnavailable, "unavailable", "inferd is shutting down; retry")
}

var errRequestIDReused = errors.New(bananaRequestIDHeader + " was already used for another request (project, route or body)")

// runFailed answers a /run request whose call could not be made.
func (a *api) runFailed(w http.ResponseWriter, r *http.Request, err error) {
	msg, internal := inferenceMessage(err)
	msg = strings.TrimPrefix(msg, "error: ")
	switch {
	case errors.Is(err, errRequestIDReused):
		runError(w, http.StatusUnprocessableEntity, "unprocessable", err.Error())
	case errors.Is(err, scheduler.ErrNeedsGPUs):
		runError(w, http.StatusInternalServerError, codeInternal, msg) // never fits: the SDK gives up on 500
	default:
		// A full queue, a team at its quota, a full disk, a daemon
		// shutting down: all pass, and the SDK retries a 503.
		if internal {
			a.log.Error().Err(err).Str("request_id", requestIDOf(w)).Str("path", truncate(r.URL.Path, 200)).Msg("run request failed")
		}
		runError(w, http.StatusServiceUnavailable, "unavailable", msg)
	}
}

// runAnswer answers with a call as it stands: the model's JSON when it
// succeeded; its error as text/plain 500 when it failed (a Potassium
// handler's exception is answered so by Potassium itself); 504 when it is
// still running once the project's inferenceTimeout has passed.
func (a *api) runAnswer(w http.ResponseWriter, c store.Call) {
	switch c.State {
	case store.CallSucceeded:
		out := bytes.Clone(bytes.TrimSpace(c.Outputs))
		if len(out) == 0 {
			out = []byte("{}")
		}
		writeBody(w, http.StatusOK, out)
	case store.CallFailed:
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.WriteHeader(http.StatusInternalServerError)
		_, _ = w.Write([]byte(failureMessage(c.Message) + "\n"))
	default:
		runError(w, http.StatusGatewayTimeout, "timeout",
			"the call is still "+pendingMessage(c)+"; check it with the callID in "+callIDHeader)
	}
}

// cleanRoute checks a route from the URL: "/" or segments of
// [A-Za-z0-9._-], never "." or "..": it becomes a path on the model's
// server.
func cleanRoute(route string) (string, bool) {
	if route == "" || route == "/" {
		return "/", true
	}
	if len(route) > maxRouteLen || !strings.HasPrefix(route, "/") {
		return "", false
	}
	for _, seg := range strings.Split(strings.TrimSuffix(route[1:], "/"), "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", false
		}
		for i := 0; i < len(seg); i++ {
			c := seg[i]
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return "", false
			}
		}
	}
	return strings.TrimSuffix(route, "/"), true
}
