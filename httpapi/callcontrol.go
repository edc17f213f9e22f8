package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/julienschmidt/httprouter"

	"inferd/scheduler"
	"inferd/store"
)

// Call control: the start fields that shape a call, cancel, queue purge and
// warm-up (DESIGN.md "Call control and events").

// decodeCallOptions checks the optional start fields into req.
func decodeCallOptions(in inferenceRequest, req *scheduler.Request) (err error) {
	if req.Timeout, err = optionalSeconds("timeout", in.Timeout); err != nil {
		return err
	}
	if req.QueueTimeout, err = optionalSeconds("queueTimeout", in.QueueTimeout); err != nil {
		return err
	}
	if !isAbsent(in.Priority) {
		s, err := requiredString("priority", in.Priority, nil)
		p, ok := store.ParsePriority(s)
		if err != nil || !ok {
			return badRequest(`priority must be "high", "normal" or "low"`)
		}
		req.Priority = p
	}
	if !isAbsent(in.IdempotencyKey) {
		key, err := requiredString("idempotencyKey", in.IdempotencyKey, badRequest("idempotencyKey must not be empty"))
		if err != nil {
			return err
		}
		if err := store.ValidateIdempotencyKey(key); err != nil {
			return badRequest("%s", err.Error())
		}
		req.IdempotencyKey = key
	}
	return nil
}

// optionalSeconds returns a whole number of seconds from 1 to
// store.MaxTimeout; missing or null is 0 (none).
func optionalSeconds(name string, raw json.RawMessage) (int, error) {
	if isAbsent(raw) {
		return 0, nil
	}
	v, err := jsonInt(name, raw)
	if err != nil || v < 1 || v > store.MaxTimeout {
		return 0, badRequest("%s must be a whole number of seconds from 1 to %d", name, store.MaxTimeout)
	}
	return v, nil
}

// cancelRequest is the body of POST /cancel/v4.
type cancelRequest struct {
	APIKey json.RawMessage `json:"apiKey"`
	CallID json.RawMessage `json:"callID"`
}

// msgCancelDone is the message of a cancel that ended its call.
const msgCancelDone = "cancelled"

// cancel handles POST /cancel/v4: end a queued or running call. The answer
// is Banana-shaped, HTTP 200: message "cancelled" once the cancel is
// durable, or "error: call already finished (succeeded)" and the like.
func (a *api) cancel(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	var req cancelRequest
	body, err := a.readBody(w, r, a.opts.MaxBodyBytes)
	if err == nil {
		err = decodeObject(body, &req)
	}
	var secret, id string
	if err == nil {
		secret, err = requiredString("apiKey", req.APIKey, errMissingAPIKey)
	}
	if err == nil {
		id, err = requiredString("callID", req.CallID, errMissingCallID)
	}
	if err != nil {
		a.fail(w, r, err)
		return
	}
	key, err := a.inferKey(secret) // a cancel is a call's business, as a check is
	if err != nil {
		a.fail(w, r, err)
		return
	}
	call, _, err := a.lookupCall(key, id)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	// The node that runs the call cancels it (cluster mode).
	remote, err := a.place.PlaceCall(r, call)
	if err != nil {
		a.failRouted(w, r, err)
		return
	}
	if remote != nil {
		if !remote.Forward(w, r, body, a.opts.StartWait) {
			a.failRouted(w, r, errClusterUnavailable)
		}
		return
	}
	call, err = a.sched.Cancel(id)
	if err != nil {
		a.fail(w, r, &schedulerError{err})
		return
	}
	resp := a.callResponse(call, reachesOf(key))
	// The cancel succeeded: "cancelled", never "success", which clients
	// read as a result (and there is none); a check answers the call's own
	// message, "error: cancelled by request".
	resp.Message = msgCancelDone
	resp.succeeded, resp.outputs = false, nil
	a.writeInference(w, resp)
}

// purgeResult answers DELETE /v1/projects/:id/queue.
type purgeResult struct {
	Removed int `json:"removed"`
}

// purgeQueue handles DELETE /v1/projects/:id/queue: cancel every call
// waiting in the project's queue (a change to the project: manage scope).
func (a *api) purgeQueue(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	p, ok := a.ownProject(w, r, ps.ByName("id"), store.PermManage)
	if !ok {
		return
	}
	n, err := a.sched.Purge(p.ID)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	writeJSON(w, http.StatusOK, purgeResult{Removed: n})
}

// warmupResult answers POST /v1/projects/:id/warmup.
type warmupResult struct {
	Ready bool   `json:"ready"`
	State string `json:"state"` // "ready", or "booting" when StartWait passed first
}

// warmup handles POST /v1/projects/:id/warmup: boot up to max(minReplicas,
// 1) replicas and answer 200 once one is ready, 202 when StartWait passes
// first (it boots on), or 503 with the boot's error. Booting for calls to
// come is the infer scope's, as starting a call is.
func (a *api) warmup(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	p, ok := a.ownProject(w, r, ps.ByName("id"), store.PermInfer)
	if !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), a.opts.StartWait)
	defer cancel()
	err := a.sched.Warmup(ctx, p)
	switch {
	case err == nil:
		writeJSON(w, http.StatusOK, warmupResult{Ready: true, State: "ready"})
	case errors.Is(err, context.DeadlineExceeded) && r.Context().Err() == nil:
		writeJSON(w, http.StatusAccepted, warmupResult{State: "booting"})
	case errors.Is(err, store.ErrNotFound):
		writeError(w, r, a.log, errProjectNotFound)
	case r.Context().Err() != nil:
		// The client is gone: nobody reads an answer; the boot goes on.
	default:
		writeError(w, r, a.log, &userError{http.StatusServiceUnavailable, codeUnavailable, err.Error()})
	}
}

// ownProject authenticates a project-API request that needs permission
// perm and returns project id when the key may reach it; otherwise it has
// answered.
func (a *api) ownProject(w http.ResponseWriter, r *http.Request, id string, perm store.Permission) (store.Project, bool) {
	key, err := a.headerKeyFor(r, perm)
	if err != nil {
		writeError(w, r, a.log, err)
		return store.Project{}, false
	}
	p, err := a.store.GetProject(id)
	switch {
	case errors.Is(err, store.ErrNotFound), err == nil && !mayReach(key, p.TeamID, p.ID):
		// Another team's project, or one outside the key's allowlist,
		// answers as a missing one: its name is never confirmed.
		writeError(w, r, a.log, errProjectNotFound)
		return store.Project{}, false
	case err != nil:
		writeError(w, r, a.log, err)
		return store.Project{}, false
	}
	return p, true
}

// queuePosition is the pending answer's place in the queue, for a queued
// call only.
func queuePosition(c store.Call) *int {
	if c.State != store.CallQueued && c.State != store.CallBooting {
		return nil
	}
	n := c.QueuePosition
	return &n
}
