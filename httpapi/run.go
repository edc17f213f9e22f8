package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/pipeline"
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
	writeJSON(w, status, respond.Refusal(code, msg))
}

// run handles POST /run/:project/*route: the call goes to that route of the
// project's model, and the answer is the model's JSON (200), or the
// handler's error text (500). It is a durable call like any other (the
// X-Inferd-Call-Id header names it for check), made once per
// X-Banana-Request-Id.
func (a *api) run(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	secret, err := headerSecret(r)
	if err != nil {
		a.runRefused(w, r, err)
		return
	}
	route, ok := cleanRoute(ps.ByName("route"))
	if !ok {
		runError(w, http.StatusNotFound, codeNotFound, "no such route: "+truncate(ps.ByName("route"), 100))
		return
	}
	req, body, ok := a.decodeRun(w, r, route)
	if !ok {
		return
	}
	// Admitted and durable before the wait (no Call.Wait): the call
	// belongs to the server once admitted, and a retry finds it by its key.
	out, ref := a.pipe.Start(r.Context(), pipeline.Request{Secret: secret, Target: pipeline.Target{ProjectID: ps.ByName("project")},
		Call: req, Hold: pipeline.HoldWait, W: w, R: r, Body: body, Wait: inferenceWait, FromNode: a.fromNode(r)})
	switch {
	case ref != nil:
		runDoor{a}.refused(w, r, ref)
		return
	case out.Forwarded:
		return
	}
	defer out.Release()
	if out.Call.Route != req.Route {
		runError(w, http.StatusUnprocessableEntity, "unprocessable", errRequestIDReused.Error())
		return
	}
	w.Header().Set(callIDHeader, out.Call.ID)
	a.awaitAnswer(w, r, runDoor{a}, out, inferenceWait(out.Project))
}

// runDoor is the dialect of Banana's Client SDK (see runRefused,
// runFailed and runAnswer).
type runDoor struct{ a *api }

func (d runDoor) failed(w http.ResponseWriter, r *http.Request, err error) { d.a.runFailed(w, r, err) }
func (runDoor) stopping(w http.ResponseWriter, _ *http.Request)            { errShuttingDown(w) }
func (d runDoor) answer(w http.ResponseWriter, _ *http.Request, c store.Call) {
	d.a.runAnswer(w, c)
}

// inferenceWait is how long a /run request waits for its call: the
// project's inferenceTimeout.
func inferenceWait(p store.Project) time.Duration {
	return time.Duration(p.InferenceTimeout) * time.Second
}

// headerSecret is the key of a request that sends it in X-Service-API-Key
// (or Banana's X-Banana-API-Key).
func headerSecret(r *http.Request) (string, error) {
	secret := r.Header.Get("X-Service-API-Key")
	if secret == "" {
		secret = r.Header.Get("X-Banana-API-Key")
	}
	if secret == "" {
		return "", errMissingHeaderKey
	}
	return secret, nil
}

// decodeRun reads a /run body into the call's request: any JSON value
// (none is {}), and the X-Banana-Request-Id as its idempotency key. It
// answers a body it refuses itself and then reports false.
func (a *api) decodeRun(w http.ResponseWriter, r *http.Request, route string) (scheduler.Request, []byte, bool) {
	body, err := a.readBody(w, r, a.opts.MaxBodyBytes)
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		runError(w, http.StatusRequestEntityTooLarge, codeTooLarge, fmt.Sprintf("request body is larger than %d bytes", tooLarge.Limit))
		return scheduler.Request{}, nil, false
	case err != nil:
		a.runRefused(w, r, err) // a budget's 429 is a 503 here, which the SDK retries
		return scheduler.Request{}, nil, false
	}
	inputs := json.RawMessage(bytes.TrimSpace(body))
	if len(inputs) == 0 {
		inputs = json.RawMessage("{}")
	}
	if !json.Valid(inputs) {
		// 422, not 400: the SDK would retry a 400 for five minutes.
		runError(w, http.StatusUnprocessableEntity, "unprocessable", "request body is not valid JSON")
		return scheduler.Request{}, nil, false
	}
	req := scheduler.Request{Inputs: inputs, Route: route, IdempotencyKey: r.Header.Get(bananaRequestIDHeader)}
	if len(req.IdempotencyKey) > store.MaxIdempotencyKeyLen {
		runError(w, http.StatusUnprocessableEntity, "unprocessable",
			fmt.Sprintf("%s is longer than %d bytes", bananaRequestIDHeader, store.MaxIdempotencyKeyLen))
		return scheduler.Request{}, nil, false
	}
	return req, body, true
}

// refused answers a /run request the call path refused.
func (d runDoor) refused(w http.ResponseWriter, r *http.Request, ref *pipeline.Refusal) {
	a := d.a
	switch ref.Kind {
	case pipeline.RefusedProject:
		// Another team's project, or one outside the key's allowlist,
		// answers as a missing one.
		runError(w, http.StatusNotFound, codeNotFound, "project not found")
	case pipeline.RefusedShuttingDown:
		errShuttingDown(w)
	case pipeline.RefusedKey, pipeline.RefusedKeyExpired, pipeline.RefusedScope, pipeline.RefusedBudget, pipeline.RefusedPlace, pipeline.RefusedUnavailable:
		a.runRefused(w, r, refusalError(ref, errInvalidHeaderKey, errProjectNotFound))
	case pipeline.RefusedIdempotency:
		a.runFailed(w, r, errRequestIDReused)
	default:
		a.runFailed(w, r, refusalError(ref, errInvalidHeaderKey, errProjectNotFound))
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
