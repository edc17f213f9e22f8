package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/openai"
	"inferd/pipeline"
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
		secret, err := bearerSecret(r)
		if err != nil {
			a.openaiError(w, r, err)
			return
		}
		body, req, err := a.decodeOpenAI(w, r, endpoint)
		if err != nil {
			a.openaiError(w, r, err)
			return
		}
		// A request held open counts as a wait of its key, a stream as an
		// event stream too (limits.maxWaitsPerKey, maxStreamsPerKey).
		hold := pipeline.HoldWait
		if req.Stream {
			hold = pipeline.HoldStream
		}
		// Admitted and durable before the wait: the call is the server's
		// once admitted, answerable by its id whatever the client does.
		out, ref := a.pipe.Start(r.Context(), pipeline.Request{
			Secret: secret, Target: pipeline.Target{ModelName: req.Model}, FromNode: a.fromNode(r),
			Call: scheduler.Request{Route: endpoint, QueueTimeout: a.openaiQueueWait()},
			Prepare: func(p store.Project, call *scheduler.Request) (err error) {
				call.Inputs, err = req.Body(p.ServedModelName()) // the name the server knows
				return err
			},
			// A plain request waits inside Start: one write for a call
			// that finishes within the wait, as a sync /start/v4. Its id
			// goes out with its answer, by when it is durable.
			Hold: hold, Sync: !req.Stream, W: w, R: r, Body: body, Wait: a.openaiWait,
		})
		switch {
		case ref != nil:
			openaiDoor{a}.refused(w, r, ref)
			return
		case out.Forwarded:
			return // a stream passed through the proxy as it came
		}
		defer out.Release()
		w.Header().Set(callIDHeader, out.Call.ID)
		if req.Stream {
			a.streamsOpen.Add(1)
			defer a.streamsOpen.Add(-1)
			a.openaiStream(w, r, out.Call.ID, req.AddedUsage)
			return
		}
		// Start waited already: what is left to wait for is a call that
		// outlasted it (answered 504) or a client that left.
		a.awaitAnswer(w, r, openaiDoor{a}, out, 0)
	}
}

// openaiDoor is OpenAI's dialect: every error in its shape
// (openaiError), a call answered as openaiAnswer does.
type openaiDoor struct{ a *api }

func (d openaiDoor) failed(w http.ResponseWriter, r *http.Request, err error) {
	d.a.openaiError(w, r, err)
}
func (d openaiDoor) stopping(w http.ResponseWriter, r *http.Request) {
	d.a.openaiError(w, r, errOAIShuttingDown)
}
func (d openaiDoor) answer(w http.ResponseWriter, r *http.Request, c store.Call) {
	d.a.openaiAnswer(w, r, c)
}

// decodeOpenAI reads and checks the body of a request to endpoint.
func (a *api) decodeOpenAI(w http.ResponseWriter, r *http.Request, endpoint string) ([]byte, openai.Request, error) {
	body, err := a.readBody(w, r, a.opts.MaxBodyBytes)
	if err != nil {
		return nil, openai.Request{}, err
	}
	req, err := openai.ParseRequest(endpoint, body)
	var re *openai.RequestError
	switch {
	case errors.As(err, &re):
		return nil, req, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: re.Param, msg: re.Msg}
	case err != nil:
		return nil, req, err
	case a.opts.Limits.MaxInputDepth > 0 && jsonDepthExceeds(body, a.opts.Limits.MaxInputDepth):
		return nil, req, badRequest("the request nests deeper than %d levels", a.opts.Limits.MaxInputDepth)
	}
	return body, req, nil
}

// openaiWait bounds the wait of an OpenAI request for its call: its queue
// wait and inference timeout end the call first, and past a guard beyond
// both the request is answered 504.
func (a *api) openaiWait(p store.Project) time.Duration {
	return time.Duration(a.openaiQueueWait()+p.InferenceTimeout)*time.Second + time.Minute
}

// refused answers a refusal of the call path in OpenAI's words.
func (d openaiDoor) refused(w http.ResponseWriter, r *http.Request, ref *pipeline.Refusal) {
	var err error
	var wrong *pipeline.WrongProtocolError
	switch {
	case errors.As(ref.Err, &wrong):
		// The key's own project, of another protocol: say so, rather than
		// that it does not exist.
		err = &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, code: "model_not_supported",
			param: "model", msg: wrong.Error()}
		d.a.openaiError(w, r, err)
		return
	}
	switch ref.Kind {
	case pipeline.RefusedShuttingDown:
		err = errOAIShuttingDown
	case pipeline.RefusedQueueFull, pipeline.RefusedCannotRun, pipeline.RefusedScheduler, pipeline.RefusedIdempotency:
		err = startRefused(ref.Err)
	default:
		err = refusalError(ref, errOAIInvalidKey, errModelNotFound)
	}
	d.a.openaiError(w, r, err)
}

// openaiQueueWait is a call's queueTimeout in seconds: the wait for a
// replica (a boot included) before the request is answered 503.
func (a *api) openaiQueueWait() int {
	return max(int(a.opts.OpenAIQueueWait/time.Second), 1)
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
	events, ok := a.relayChunks(r, s, id, done, sub.ch)
	if !ok {
		return
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

// relayChunks sends call id's chunks from events to s as they come, until
// the call is done (its last chunks drained). Until the first chunk
// nothing is written: a failure then is answered with its status; the
// queue wait and inference timeout end the call. It reports false when
// the stream has ended already: its client left (the call is ended with
// it), inferd stops, or the call was run again mid-stream; events is nil
// once the client fell behind them (the rest comes from the stored
// result).
func (a *api) relayChunks(r *http.Request, s *chunkWriter, id string, done <-chan struct{}, events <-chan streamEvent) (<-chan streamEvent, bool) {
	ka := time.NewTicker(sseKeepAlive)
	defer ka.Stop()
	for !isClosed(done) {
		if s.started {
			s.flush()
			if s.err != nil {
				a.cancelLeft(id) // the client is gone, or too slow to read (limits.streamWriteTimeout)
				return nil, false
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
				return nil, false
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
			return nil, false
		case <-a.opts.Stopping:
			return nil, false
		}
	}
	open := drain(events, func(e streamEvent) { // chunks sent before the end
		if e.output != nil {
			s.chunk(e.output)
		}
	})
	if !open {
		return nil, true
	}
	return events, true
}

// cancelLeft ends the call of a stream whose client went away: the
// model's request is aborted and the call ends "cancelled: the client
// disconnected" (scheduler's Disconnected).
func (a *api) cancelLeft(id string) {
	if _, err := a.sched.Disconnected(id); err != nil && !errors.Is(err, scheduler.ErrFinished) {
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
