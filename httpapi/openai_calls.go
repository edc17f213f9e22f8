package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/cluster"
	"inferd/openai"
	"inferd/scheduler"
	"inferd/store"
)

// openaiCall handles POST of an OpenAI endpoint: the request becomes a
// durable call of the project its model names (its X-Inferd-Call-Id
// header names it), routed to that path of the model's server. A plain
// request waits for the result and answers the server's JSON; a stream
// passes each chunk on as it comes (openaiStream).
func (a *api) openaiCall(endpoint string) httprouter.Handle {
	return func(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
		key, err := a.bearerKey(r, store.PermInfer)
		if err != nil {
			a.openaiError(w, r, err)
			return
		}
		body, err := a.readBody(w, r, a.opts.MaxBodyBytes)
		if err != nil {
			a.openaiError(w, r, err)
			return
		}
		req, err := openai.ParseRequest(endpoint, body)
		var re *openai.RequestError
		switch {
		case errors.As(err, &re):
			a.openaiError(w, r, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: re.Param, msg: re.Msg})
			return
		case err != nil:
			a.openaiError(w, r, err)
			return
		case a.opts.Limits.MaxInputDepth > 0 && jsonDepthExceeds(body, a.opts.Limits.MaxInputDepth):
			a.openaiError(w, r, badRequest("the request nests deeper than %d levels", a.opts.Limits.MaxInputDepth))
			return
		}
		projects, err := a.callableProjects(key)
		if err != nil {
			a.openaiError(w, r, err)
			return
		}
		p, ok := store.ResolveModel(projects, req.Model)
		if !ok {
			a.openaiError(w, r, errModelNotFound)
			return
		}
		// In cluster mode a project placed on other nodes runs there; a
		// stream passes through the proxy as it comes.
		nodes, err := a.startNodes(r, p)
		if err != nil {
			a.openaiError(w, r, err)
			return
		}
		if nodes != nil {
			a.openaiForward(w, r, body, nodes, p)
			return
		}
		inputs, err := req.Body(p.ServedModelName())
		if err != nil {
			a.openaiError(w, r, err)
			return
		}
		// A request held open counts as a wait of its key, a stream as an
		// event stream too (limits.maxWaitsPerKey, maxStreamsPerKey).
		release, err := a.holdOpen(key.ID, req.Stream)
		if err != nil {
			if be, ok := err.(*budgetError); ok {
				a.refused(be.budget)
			}
			a.openaiError(w, r, err)
			return
		}
		defer release()
		// Admitted and durable before the wait: the call is the server's
		// once admitted, answerable by its id whatever the client does.
		call, err := a.sched.Start(context.WithoutCancel(r.Context()), p, scheduler.Request{
			Inputs: inputs, Route: endpoint, QueueTimeout: a.openaiQueueWait(),
		})
		if err != nil {
			a.openaiError(w, r, startRefused(err))
			return
		}
		w.Header().Set(callIDHeader, call.ID)
		if req.Stream {
			a.streamsOpen.Add(1)
			defer a.streamsOpen.Add(-1)
			a.openaiStream(w, r, call.ID, req.AddedUsage)
			return
		}
		call, ok = a.awaitCall(w, r, p, call.ID)
		if ok {
			a.openaiAnswer(w, r, call)
		}
	}
}

// holdOpen takes one of the key's held-open requests: a wait, or for a
// stream an event stream.
func (a *api) holdOpen(keyID string, stream bool) (release func(), err error) {
	if stream {
		return a.limits.beginStream(keyID)
	}
	release, ok := a.limits.beginWait(keyID)
	if !ok {
		return nil, &oaiError{status: http.StatusTooManyRequests, typ: openai.TypeRateLimit, code: codeRateLimited,
			msg: "too many requests of this API key are waiting; retry later", retryAfter: "1"}
	}
	return release, nil
}

// openaiQueueWait is a call's queueTimeout in seconds: the wait for a
// replica (a boot included) before the request is answered 503.
func (a *api) openaiQueueWait() int {
	return max(int(a.opts.OpenAIQueueWait/time.Second), 1)
}

// awaitCall waits for call id to finish: its queue wait and inference
// timeout bound that, and a guard past both answers 504. It reports false
// when the client left (the call runs on, its result kept) or the daemon
// stops (answered 503).
func (a *api) awaitCall(w http.ResponseWriter, r *http.Request, p store.Project, id string) (store.Call, bool) {
	call, done, err := a.sched.Lookup(id)
	if err != nil {
		a.openaiError(w, r, err)
		return store.Call{}, false
	}
	wait := time.Duration(a.openaiQueueWait()+p.InferenceTimeout)*time.Second + time.Minute
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + time.Minute))
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-r.Context().Done():
		if isClosed(a.opts.Stopping) {
			a.openaiError(w, r, errOAIShuttingDown)
		}
		return store.Call{}, false
	case <-a.opts.Stopping:
		a.openaiError(w, r, errOAIShuttingDown)
		return store.Call{}, false
	}
	// The call as it stands now: the first lookup may predate its end.
	if c, _, err := a.sched.Lookup(id); err == nil {
		call = c
	}
	return call, true
}

var errOAIShuttingDown = &oaiError{status: http.StatusServiceUnavailable, typ: openai.TypeUnavailable, code: "shutting_down",
	msg: "inferd is shutting down; retry", retryAfter: "1"}

// openaiAnswer answers a call as the OpenAI route does: the server's JSON
// when it succeeded, its failure in OpenAI's shape (failedCall), or 504
// while it still runs.
func (a *api) openaiAnswer(w http.ResponseWriter, r *http.Request, c store.Call) {
	switch c.State {
	case store.CallSucceeded:
		writeBody(w, http.StatusOK, bytes.Clone(bytes.TrimSpace(c.Outputs)))
	case store.CallFailed:
		a.openaiError(w, r, failedCall(c))
	default:
		a.openaiError(w, r, &oaiError{status: http.StatusGatewayTimeout, typ: openai.TypeTimeout, code: "timeout",
			msg: "the call is still " + pendingMessage(c) + "; fetch its result later with the id in " + callIDHeader})
	}
}

// failedCall is the OpenAI error of a failed call (openai.CallFailure).
func failedCall(c store.Call) *oaiError {
	f := openai.CallFailure(c)
	d := f.Body.Error
	return &oaiError{status: f.Status, typ: d.Type, code: deref(d.Code), param: deref(d.Param), msg: d.Message, retryAfter: f.RetryAfter, final: f.Final}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

// openaiForward passes a request to the node that runs its project
// (cluster mode), its answer, a stream included, back as it comes.
func (a *api) openaiForward(w http.ResponseWriter, r *http.Request, body []byte, nodes []cluster.NodeInfo, p store.Project) {
	wait := time.Duration(a.openaiQueueWait()+p.InferenceTimeout)*time.Second + time.Minute
	_ = http.NewResponseController(w).SetWriteDeadline(time.Now().Add(wait + time.Minute))
	switch {
	case a.forward(w, r, body, nodes, a.opts.Routing.forwardLimit(wait)):
	case isClosed(a.opts.Stopping):
		a.openaiError(w, r, errOAIShuttingDown)
	default:
		a.openaiError(w, r, errClusterUnavailable)
	}
}

// openaiResponse handles GET /v1/calls/:callID/response: a call made
// through the OpenAI routes, answered as its request was or would have
// been (the server's JSON, a stream's chunks as a JSON array, or the
// failure's error and status); 202 with its state while it is pending.
// The key (Bearer, or X-Service-API-Key) must reach the call's project.
func (a *api) openaiResponse(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	var key store.APIKey
	var err error
	if r.Header.Get("Authorization") != "" {
		key, err = a.bearerKey(r, store.PermInfer)
	} else {
		key, err = a.headerKeyFor(r, store.PermInfer)
	}
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	c, _, err := a.sched.Lookup(ps.ByName("callID"))
	switch {
	case errors.Is(err, store.ErrNotFound) || err == nil && !mayReach(key, c.TeamID, c.ProjectID):
		a.openaiError(w, r, &oaiError{status: http.StatusNotFound, typ: openai.TypeInvalidRequest, code: "not_found",
			msg: "call not found (unknown, expired, or not yours)"})
		return
	case err != nil:
		a.openaiError(w, r, err)
		return
	case !c.State.Done():
		writeJSON(w, http.StatusAccepted, pendingCall{ID: c.ID, Object: "inferd.call", Status: pendingMessage(c)})
		return
	}
	a.openaiAnswer(w, r, c)
}

// pendingCall answers GET /v1/calls/:callID/response for a call still
// queued or running.
type pendingCall struct {
	ID     string `json:"id"`
	Object string `json:"object"`
	Status string `json:"status"`
}

// openaiStream answers a streaming request: it waits for the call's first
// chunk (a failure before it is answered as a plain request's), then sends
// each chunk as an SSE data event the moment the model sent it, flushed,
// and data: [DONE] at the end. The usage chunk inferd asked for is held
// back when the client did not (addedUsage). A client that goes away
// cancels the call, which aborts the model's request. A client too slow
// for the live events gets the rest from the call's stored result.
func (a *api) openaiStream(w http.ResponseWriter, r *http.Request, id string, addedUsage bool) {
	_, backlog, sub, unsubscribe := a.opts.Streams.subscribe(id)
	defer unsubscribe()
	_, done, err := a.sched.Lookup(id)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	s := &chunkWriter{sseWriter: sseWriter{w: w, rc: http.NewResponseController(w), timeout: a.opts.Limits.StreamWriteTimeout}, hideUsage: addedUsage}
	defer func() {
		if s.cut() {
			a.refused(budgetStreamWriteTimeout)
		}
	}()
	for _, line := range backlog {
		s.chunk(line)
	}
	events := sub.ch
	ka := time.NewTicker(sseKeepAlive)
	defer ka.Stop()
	// Until the first chunk nothing is written: a failure then is answered
	// with its status. The queue wait and inference timeout end the call.
	for !isClosed(done) {
		if s.started {
			s.flush()
			if s.err != nil {
				a.cancelLeft(id) // the client is gone, or too slow to read (limits.streamWriteTimeout)
				return
			}
		}
		select {
		case e, ok := <-events:
			switch {
			case !ok:
				events = nil // fell behind: the rest comes from the stored result
			case e.output == nil && s.sent > 0:
				// The call is run again (a crashed replica and retries):
				// its chunks would start over in the middle of these.
				s.errorEvent(openai.NewError(openai.TypeServer, "model_restarted", "", "the model's replica restarted mid-stream; retry"))
				s.flush()
				return
			case e.output != nil:
				s.chunk(e.output)
			}
		case <-done:
		case <-ka.C:
			if s.started {
				s.comment("keep-alive")
			}
		case <-r.Context().Done():
			if !isClosed(a.opts.Stopping) {
				a.cancelLeft(id)
			}
			return
		case <-a.opts.Stopping:
			return
		}
	}
	for drained := false; !drained && events != nil; { // chunks sent before the end
		select {
		case e, ok := <-events:
			if !ok {
				events = nil
			} else if e.output != nil {
				s.chunk(e.output)
			}
		default:
			drained = true
		}
	}
	call, _, err := a.sched.Lookup(id)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	if !s.started && (call.State != store.CallSucceeded || !call.Streamed) {
		a.openaiAnswer(w, r, call) // a failure, or a server that did not stream
		return
	}
	if call.State == store.CallSucceeded && events == nil {
		s.rest(call.Outputs)
	}
	if call.State == store.CallFailed {
		e := failedCall(call)
		s.errorEvent(openai.NewError(e.typ, e.code, e.param, e.msg))
	} else {
		s.data([]byte(openai.Done))
	}
	s.flush()
}

// cancelLeft cancels the call of a stream whose client went away: the
// model's request is aborted and the call ends "cancelled by request".
func (a *api) cancelLeft(id string) {
	if _, err := a.sched.Cancel(id); err != nil && !errors.Is(err, scheduler.ErrFinished) {
		a.log.Warn().Err(err).Str("call", id).Msg("cancelling the call of a stream whose client left failed")
	}
}

// chunkWriter writes an OpenAI stream: each chunk as one SSE data event,
// within the stream write deadline of the events endpoint (sseWriter). It
// counts the chunks it has seen, so that the rest can be taken from the
// stored result.
type chunkWriter struct {
	sseWriter
	hideUsage bool
	started   bool // the header is out
	sent      int  // chunks seen, hidden ones included
}

func (s *chunkWriter) start() {
	if s.started {
		return
	}
	s.started = true
	if s.timeout <= 0 {
		_ = s.rc.SetWriteDeadline(time.Time{}) // the stream lasts as long as the call
	}
	h := s.w.Header()
	h.Set("Content-Type", "text/event-stream; charset=utf-8")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no") // nginx would otherwise hold chunks back
	s.w.WriteHeader(http.StatusOK)
}

// chunk sends one chunk, compacted (SSE data holds no line break).
func (s *chunkWriter) chunk(line json.RawMessage) {
	s.sent++
	if s.hideUsage && openai.UsageOnly(line) {
		return
	}
	var buf bytes.Buffer
	if json.Compact(&buf, line) != nil {
		return // the protocol client passes only valid JSON
	}
	s.data(buf.Bytes())
}

// rest sends the chunks of a finished call's stored outputs (the JSON
// array of its chunks) that the live events missed.
func (s *chunkWriter) rest(outputs json.RawMessage) {
	var chunks []json.RawMessage
	if json.Unmarshal(outputs, &chunks) != nil {
		return
	}
	for _, c := range chunks[min(s.sent, len(chunks)):] {
		s.chunk(c)
	}
}

func (s *chunkWriter) errorEvent(e openai.ErrorBody) {
	b, _ := json.Marshal(e)
	s.data(b)
}

func (s *chunkWriter) data(b []byte) {
	s.start()
	if s.begin() {
		s.write([]byte("data: "))
		s.write(b)
		s.write([]byte("\n\n"))
	}
}

func (s *chunkWriter) flush() {
	if s.started {
		s.sseWriter.flush()
	}
}
