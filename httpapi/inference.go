package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/julienschmidt/httprouter"

	"inferd/pipeline"
	"inferd/scheduler"
	"inferd/store"
)

// inferenceRequest is the body of Start and Check. Every field is kept raw,
// a slice of the body as read (decodeInferenceRequest), so that a wrong type
// gets a message naming the field, and the inputs are the body's one copy in
// memory rather than a second, megabytes for an image; unknown fields (the
// SDKs send id and created) are ignored.
type inferenceRequest struct {
	APIKey      json.RawMessage
	ModelKey    json.RawMessage
	ModelInputs json.RawMessage
	StartOnly   json.RawMessage
	CallID      json.RawMessage
	LongPoll    json.RawMessage
	// Call control (start only; see callcontrol.go).
	Timeout        json.RawMessage
	QueueTimeout   json.RawMessage
	Priority       json.RawMessage
	IdempotencyKey json.RawMessage
	// Webhook and WebhookEvents ask for signed POSTs of the call's events
	// (webhook.go).
	Webhook       json.RawMessage
	WebhookEvents json.RawMessage
}

// inferenceResponse is the body of every Start and Check answer, errors
// included. modelOutputs, null unless the call succeeded, is added by
// newAnswer from outputs, the model's reply as stored, without encoding it.
type inferenceResponse struct {
	ID         string `json:"id"`
	Message    string `json:"message"`
	Created    int64  `json:"created"`
	APIVersion string `json:"apiVersion"`
	CallID     string `json:"callID"`
	Finished   bool   `json:"finished"`
	// QueuePosition: for a queued call, how many go before it (0 = next).
	QueuePosition *int `json:"queuePosition,omitempty"`
	// WaitingFor: for a queued call, why it waits (a code and a sentence);
	// message stays the state name. EtaMs: how long until it has likely
	// finished, when the scheduler can tell (estimate.go).
	WaitingFor *store.Wait `json:"waitingFor,omitempty"`
	EtaMs      *int64      `json:"etaMs,omitempty"`
	// EtaRangeMs: how rough EtaMs is, [lower, upper] from the project's
	// 10th and 90th percentile recent runs; present with EtaMs.
	EtaRangeMs *[2]int64 `json:"etaRangeMs,omitempty"`
	QueueMs    *int64    `json:"queueMs,omitempty"`
	BootMs     *int64    `json:"bootMs,omitempty"`
	RunMs      *int64    `json:"runMs,omitempty"`
	// BatchSize and BatchWaitMs: for a call that ran in a batch, how many
	// calls the batch carried and how long it waited for it to fill.
	BatchSize   *int   `json:"batchSize,omitempty"`
	BatchWaitMs *int64 `json:"batchWaitMs,omitempty"`

	succeeded bool            // modelOutputs is [outputs], not null
	listed    bool            // outputs are the modelOutputs list already (streamed)
	outputs   json.RawMessage // the model's raw JSON reply
}

var newline = []byte("\n")

// answer encodes fields, resp or a struct that embeds it, with resp's
// outputs (see newAnswer).
func (resp inferenceResponse) answer(fields any) (answer, error) {
	return newAnswer(fields, resp.outputs, resp.succeeded, resp.listed)
}

// ownAnswer is answer(resp) for resp itself, the answer of every start and
// check: resp is not boxed in an interface, which would copy it to the heap
// (half a KiB a call).
func (resp inferenceResponse) ownAnswer() answer {
	return finishAnswer(resp.appendJSON(make([]byte, 0, responseSize+len(outputsOpen))), resp.outputs, resp.succeeded, resp.listed)
}

// ptr returns a pointer to a copy of v.
func ptr[T any](v T) *T { return &v }

func (a *api) newResponse(message, callID string) inferenceResponse {
	return inferenceResponse{
		ID:         uuid.NewString(),
		Message:    message,
		Created:    time.Now().Unix(),
		APIVersion: a.opts.APIVersion,
		CallID:     callID,
	}
}

// writeInference answers an inference request: always HTTP 200, the outcome
// is in message. The outputs are written as the store holds them (see
// newAnswer); once written, the answer keeps no reference to them.
func (a *api) writeInference(w http.ResponseWriter, resp inferenceResponse) {
	a.writeInferenceStatus(w, http.StatusOK, resp)
}

// writeInferenceStatus writes an inference response with the given status.
func (a *api) writeInferenceStatus(w http.ResponseWriter, status int, resp inferenceResponse) {
	ans := resp.ownAnswer()
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(ans.Len()+1))
	w.WriteHeader(status)
	if _, err := ans.WriteTo(w); err == nil { // a failed write means the client is gone
		_, _ = w.Write(newline)
	}
}

// fail answers an inference request that failed before a call existed.
// Every answer is HTTP 200 but one: etcd not answering in cluster mode is a
// 503 (see inferenceStatus).
func (a *api) fail(w http.ResponseWriter, r *http.Request, err error) {
	msg, internal := inferenceMessage(err)
	if internal {
		a.log.Error().Err(err).Str("request_id", requestIDOf(w)).
			Str("path", r.URL.Path).Msg("inference request failed")
	}
	a.writeInferenceStatus(w, inferenceStatus(err), a.newResponse(msg, ""))
}

// startArgs are the checked fields of a Start body.
type startArgs struct {
	body             []byte // as read, for a forward to another node
	apiKey, modelKey string
	req              scheduler.Request // the inputs and the call-control fields
	startOnly        bool
}

// checkArgs are the checked fields of a Check body.
type checkArgs struct {
	apiKey, callID string
	longPoll       bool
}

// start handles POST /start/v4: admit a call and, unless startOnly, wait up
// to StartWait for its result. Over its key's cap on held-open waits the
// call is still admitted and answered at once with its state, as a
// startOnly would be.
func (a *api) start(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	args, err := a.decodeStart(w, r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	req := pipeline.Request{Secret: args.apiKey, Target: pipeline.Target{ModelKey: args.modelKey}, Call: args.req,
		W: w, R: r, Body: args.body, Wait: a.startWait, FromNode: a.fromNode(r)}
	if !args.startOnly {
		// One write for a call that finishes within the wait (see
		// SubmitWait); the call runs on if the client goes away.
		req.Hold, req.MayDegrade, req.Sync = pipeline.HoldWait, true, true
	}
	out, ref := a.pipe.Start(r.Context(), req)
	switch {
	case ref != nil:
		bananaDoor{a}.refused(w, r, ref)
	case !out.Forwarded:
		out.Release()
		bananaDoor{a}.answer(w, r, out.Call, out.Key)
	}
}

// startWait is how long a start waits on the node it is forwarded to.
func (a *api) startWait(store.Project) time.Duration { return a.opts.StartWait }

// bananaDoor is the Banana API's dialect: HTTP 200 and the outcome in
// message (a 503 when no node of the cluster could take the call).
type bananaDoor struct{ a *api }

func (d bananaDoor) refused(w http.ResponseWriter, r *http.Request, ref *pipeline.Refusal) {
	err := refusalError(ref, errInvalidAPIKey, errUnknownModelKey)
	if ref.Kind == pipeline.RefusedShuttingDown {
		err = errClusterUnavailable // a forward cut short: another node may take it
	}
	d.a.failRouted(w, r, err)
}

// answer renders call c as key sees it (its waitingFor names only the
// projects key reaches).
func (d bananaDoor) answer(w http.ResponseWriter, _ *http.Request, c store.Call, key store.APIKey) {
	d.a.writeInference(w, d.a.callResponse(c, reachesOf(key)))
}

// check handles POST /check/v4: report a call's state and, with longPoll,
// wait up to LongPollWait for its result.
func (a *api) check(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	args, err := a.decodeCheck(w, r)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	key, err := a.inferKey(args.apiKey)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	call, done, err := a.lookupCall(key, args.callID)
	if err != nil {
		a.fail(w, r, err)
		return
	}
	if args.longPoll && !call.State.Done() {
		end := a.opts.Metrics.LongPollBegin()
		call = a.await(r.Context(), key.ID, call, done, a.opts.LongPollWait)
		end()
	}
	a.writeInference(w, a.callResponse(call, reachesOf(key)))
}

// lookupCall returns call id and its completion signal when key may reach
// it (its team's, within the key's project allowlist). Another team's call is
// errCallNotFound, as an unknown one is: its existence is never revealed.
func (a *api) lookupCall(key store.APIKey, id string) (store.Call, <-chan struct{}, error) {
	call, done, err := a.sched.Lookup(id)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return store.Call{}, nil, errCallNotFound
	case err != nil:
		return store.Call{}, nil, err
	case !mayReach(key, call.TeamID, call.ProjectID):
		return store.Call{}, nil, errCallNotFound
	}
	return call, done, nil
}

// await waits, as one of keyID's held-open waits, until the call is done,
// the wait ends or the client goes away (pipeline.Await), and returns the
// call as it then stands. When keyID already holds as many waits as Limits
// allow, the call is returned as it stands (see Limits.MaxWaits).
func (a *api) await(ctx context.Context, keyID string, call store.Call, done <-chan struct{}, wait time.Duration) store.Call {
	release, ok := a.limits.beginWait(keyID)
	if !ok {
		return call
	}
	defer release()
	call, _, _ = a.pipe.Await(ctx, call, done, wait)
	return call
}

// callResponse renders a call: success with its outputs, a final error, or
// the pending state, its waitingFor naming only projects for which reaches
// is true (the caller's key's: reachesOf).
func (a *api) callResponse(c store.Call, reaches func(teamID, projectID string) bool) inferenceResponse {
	resp := a.newResponse("", c.ID)
	switch c.State {
	case store.CallSucceeded:
		resp.Message = "success"
		resp.Finished = true
		resp.succeeded, resp.outputs = true, c.Outputs
		resp.listed = c.Streamed // the outputs are already the list of lines
	case store.CallFailed:
		resp.Finished = true
		resp.Message = failureMessage(c.Message)
	default:
		resp.Message = pendingMessage(c)
		resp.QueuePosition = queuePosition(c)
		if resp.QueuePosition != nil {
			resp.WaitingFor, resp.EtaMs, resp.EtaRangeMs = c.WaitingFor.Shown(reaches), c.ETAMs, c.ETARangeMs
		}
	}
	// Copies, not pointers into c: a pointer into c would move all of
	// it (a store.Call, half a KiB) to the heap on every answer.
	if !c.Dispatched.IsZero() {
		resp.QueueMs = ptr(c.QueueMs)
		if c.State.Done() {
			resp.RunMs = ptr(c.RunMs)
		}
	}
	if c.BootMs > 0 {
		resp.BootMs = ptr(c.BootMs)
	}
	if c.BatchSize > 0 {
		resp.BatchSize, resp.BatchWaitMs = ptr(c.BatchSize), ptr(c.BatchWaitMs)
	}
	return resp
}

// pendingMessage is the state of an unfinished call, or the scheduler's
// account of it ("booting (attempt 2 of 3; last: …)"); it never contains
// "error", which clients read as a failure.
func pendingMessage(c store.Call) string {
	if c.Message != "" && !strings.Contains(strings.ToLower(c.Message), "error") {
		return c.Message
	}
	if c.State == "" || strings.Contains(string(c.State), "error") {
		return string(store.CallQueued)
	}
	return string(c.State)
}

// authenticate checks an API key secret and takes one request from the key's
// rate limit. Unknown, malformed and revoked keys all give invalid, which
// never says which; an expired key is told so (only its holder can know
// its secret).
func (a *api) authenticate(secret string, invalid error) (store.APIKey, error) {
	key, err := a.store.Authenticate(secret)
	return a.authenticated(key, err, invalid)
}

// authenticated is authenticate for a key already read (err: the store's
// Authenticate error).
func (a *api) authenticated(key store.APIKey, err error, invalid error) (store.APIKey, error) {
	key, err = a.keyValid(key, err, invalid)
	if err != nil {
		return store.APIKey{}, err
	}
	if err := a.limits.allow(key.ID); err != nil {
		return store.APIKey{}, err
	}
	return key, nil
}

// keyValid is authenticated without the rate: for a request another node
// of the cluster forwarded, which spent the key's rate where the client
// sent it (a start spends it once, on the node it reached first).
func (a *api) keyValid(key store.APIKey, err error, invalid error) (store.APIKey, error) {
	switch {
	case errors.Is(err, store.ErrInvalidKey), errors.Is(err, store.ErrNotFound):
		return store.APIKey{}, invalid
	case err != nil:
		return store.APIKey{}, err
	case key.IsRevoked():
		return store.APIKey{}, invalid
	case key.ExpiredAt(time.Now()):
		return store.APIKey{}, errKeyExpired
	}
	return key, nil
}

// inferKey authenticates the apiKey of a start, check or cancel body: calls
// are the infer scope's business.
func (a *api) inferKey(secret string) (store.APIKey, error) {
	key, err := a.authenticate(secret, errInvalidAPIKey)
	if err != nil {
		return store.APIKey{}, err
	}
	return key, requirePermission(key, store.PermInfer)
}

// mayAccess reports whether key may see what belongs to teamID.
func mayAccess(key store.APIKey, teamID string) bool {
	return key.Scope == store.ScopeAdmin || key.TeamID == teamID
}

// decodeStart reads a Start body and checks each field's presence and type.
func (a *api) decodeStart(w http.ResponseWriter, r *http.Request) (args startArgs, err error) {
	req, body, err := a.decodeInference(w, r)
	args.body = body
	if err != nil {
		return args, err
	}
	if args.apiKey, err = requiredString("apiKey", req.APIKey, errMissingAPIKey); err != nil {
		return args, err
	}
	if args.modelKey, err = requiredString("modelKey", req.ModelKey, errMissingModelKey); err != nil {
		return args, err
	}
	switch {
	case isAbsent(req.ModelInputs):
		return args, errMissingInputs
	case req.ModelInputs[0] != '{': // a RawMessage starts at its value
		return args, errInputsNotObject
	case a.opts.Limits.MaxInputDepth > 0 && jsonDepthExceeds(req.ModelInputs, a.opts.Limits.MaxInputDepth):
		return args, errInputsTooDeep(a.opts.Limits.MaxInputDepth)
	}
	args.req.Inputs = req.ModelInputs
	if args.startOnly, err = optionalBool("startOnly", req.StartOnly); err != nil {
		return args, err
	}
	if err := decodeCallOptions(req, &args.req); err != nil {
		return args, err
	}
	args.req.Webhook, args.req.WebhookEvents, err = a.decodeWebhook(req.Webhook, req.WebhookEvents)
	return args, err
}

// decodeCheck reads a Check body and checks each field's presence and type.
func (a *api) decodeCheck(w http.ResponseWriter, r *http.Request) (args checkArgs, err error) {
	req, _, err := a.decodeInference(w, r)
	if err != nil {
		return args, err
	}
	if args.apiKey, err = requiredString("apiKey", req.APIKey, errMissingAPIKey); err != nil {
		return args, err
	}
	if args.callID, err = requiredString("callID", req.CallID, errMissingCallID); err != nil {
		return args, err
	}
	args.longPoll, err = optionalBool("longPoll", req.LongPoll)
	return args, err
}

// decodeInference reads the body of Start or Check, which must be a JSON
// object; it returns the body as read with the fields decoded from it.
func (a *api) decodeInference(w http.ResponseWriter, r *http.Request) (inferenceRequest, []byte, error) {
	var req inferenceRequest
	body, err := a.readBody(w, r, a.opts.MaxBodyBytes)
	if err != nil {
		return req, nil, err
	}
	// The JSON decoder lets bytes that are not UTF-8 through inside strings,
	// where they would reach the model and, echoed, answers clients cannot
	// read.
	if i := store.InvalidUTF8(body); i >= 0 {
		return req, nil, badRequest("request body is not valid UTF-8 at byte %d", i)
	}
	req, err = decodeInferenceRequest(body)
	return req, body, err
}

// requiredString returns a string field; missing, null and "" give ifMissing.
func requiredString(name string, raw json.RawMessage, ifMissing error) (string, error) {
	if isAbsent(raw) {
		return "", ifMissing
	}
	if raw[0] != '"' {
		return "", badRequest("%s must be a string", name)
	}
	var s string
	if bytes.IndexByte(raw, '\\') < 0 {
		s = string(raw[1 : len(raw)-1]) // no escapes: skip the decoder
	} else if err := json.Unmarshal(raw, &s); err != nil {
		return "", badRequest("%s must be a string", name)
	}
	if s == "" {
		return "", ifMissing
	}
	return s, nil
}

// optionalBool returns a boolean field; missing or null is false.
func optionalBool(name string, raw json.RawMessage) (bool, error) {
	switch string(raw) {
	case "", "null", "false":
		return false, nil
	case "true":
		return true, nil
	}
	return false, badRequest("%s must be a boolean (true or false)", name)
}
