package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"sync"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/pipeline"
	"inferd/scheduler"
	"inferd/store"
)

// The operator's door: inferd call PROJECT INPUTS. The admin API serves it
// on the daemon's socket (POST /admin/projects/:id/call, handed to it as
// OperatorCalls), and in cluster mode a node serves it to the others under
// /cluster/v1/, where the call path's placer forwards it when the project
// runs on another node. It is a door like the others: a decoder and a
// renderer over the call path, with no key (pipeline.Request.Operator).

// operatorCallPath is where a node serves the operator's calls that other
// nodes forward to it.
const operatorCallPath = clusterPrefix + "projects/:id/call"

// OperatorCalls returns the handler of the operator's calls (inferd call)
// for the admin API: POST /admin/projects/:id/call[?stream=1], the
// project's id in the route's parameters.
func (s *Server) OperatorCalls() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.a.operatorCall(w, r, httprouter.ParamsFromContext(r.Context()))
	})
}

// operatorCallLine is one line of the operator's call's answer: an output
// line the model streamed (Output), or the call's end (the other fields).
type operatorCallLine struct {
	Output  json.RawMessage   `json:"output,omitempty"`
	CallID  string            `json:"callID,omitempty"`
	State   store.CallState   `json:"state,omitempty"`
	Message string            `json:"message,omitempty"`
	Outputs []json.RawMessage `json:"outputs,omitempty"`
}

// operatorWait bounds the forward of an operator's call to another node:
// it waits for its call as long as its client does, which the longest
// timeout a project may have bounds.
func operatorWait(store.Project) time.Duration { return store.MaxTimeout * time.Second }

// operatorCall handles an operator's call: the body is the call's inputs
// (any JSON; empty is {}). It makes a durable call of the project, as a
// start does, waits for its end, and answers one JSON line with its
// callID, state, message and outputs; with stream=1, first a line
// {"output": …} for each line the model streams, as it streams it. A
// client that goes away before the end cancels the call (inferd call's
// Ctrl-C).
func (a *api) operatorCall(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	body, inputs, err := a.decodeOperatorCall(w, r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	out, ref := a.pipe.Start(r.Context(), pipeline.Request{Operator: true, Target: pipeline.Target{ProjectID: id},
		Call: scheduler.Request{Inputs: inputs}, W: w, R: operatorForward(r, id), Body: body, Wait: operatorWait})
	switch {
	case ref != nil:
		a.operatorRefused(w, r, id, ref)
		return
	case out.Forwarded:
		return // the node that ran it answered
	}
	defer out.Release()
	a.operatorAnswer(w, r, out.Call, r.URL.Query().Get("stream") == "1")
}

// decodeOperatorCall reads an operator's call's inputs: any JSON value,
// none is {}.
func (a *api) decodeOperatorCall(w http.ResponseWriter, r *http.Request) ([]byte, json.RawMessage, error) {
	body, err := readBody(w, r, a.opts.MaxBodyBytes)
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			return nil, nil, err
		}
		return nil, nil, badRequest("read the inputs: %v", err)
	}
	inputs := json.RawMessage(bytes.TrimSpace(body))
	if len(inputs) == 0 {
		inputs = json.RawMessage("{}")
	}
	if !json.Valid(inputs) {
		return nil, nil, badRequest("the inputs are not valid JSON")
	}
	return body, inputs, nil
}

// operatorForward is the request a forward of an operator's call sends:
// to the other node's /cluster/v1/, since no node serves its admin API
// but on its own socket.
func operatorForward(r *http.Request, id string) *http.Request {
	f := r.Clone(r.Context())
	f.URL.Path, f.URL.RawPath = clusterPrefix+"projects/"+url.PathEscape(id)+"/call", ""
	return f
}

// operatorRefused answers an operator's call the call path refused, in the
// admin API's JSON errors.
func (a *api) operatorRefused(w http.ResponseWriter, r *http.Request, id string, ref *pipeline.Refusal) {
	switch ref.Kind {
	case pipeline.RefusedProject:
		writeError(w, r, a.log, notFound("project %s not found", truncate(id, 64)))
	case pipeline.RefusedInternal, pipeline.RefusedStorageFull:
		writeError(w, r, a.log, ref.Err)
	default:
		// A full queue, a model that cannot run here, no node to take
		// it, a daemon shutting down: the call was not made.
		msg, _ := inferenceMessage(refusalError(ref, nil, nil))
		writeError(w, r, a.log, &userError{http.StatusServiceUnavailable, codeUnavailable, msg})
	}
}

// operatorAnswer waits for call c (pipeline.Await) and answers its end as
// one line, after the lines the model streams when stream is set.
func (a *api) operatorAnswer(w http.ResponseWriter, r *http.Request, c store.Call, stream bool) {
	var backlog []json.RawMessage
	var lines <-chan streamEvent
	if stream {
		// Subscribed before the wait's first look at the call, so that no
		// line streamed after it is missed.
		var sub *subscriber
		var cancel func()
		_, backlog, sub, cancel = a.opts.Streams.subscribe(c.ID)
		defer cancel()
		lines = sub.ch
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // as long as the call takes
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	_ = rc.Flush()
	var pump sync.WaitGroup
	stop := make(chan struct{})
	if stream {
		// The only writer until the call ends.
		pump.Go(func() { writeOutputs(w, backlog, lines, stop) })
	}
	end, why := c, pipeline.WaitOver
	for why == pipeline.WaitOver {
		var err error
		if end, why, err = a.pipe.Await(r.Context(), end, nil, time.Hour); err != nil {
			break // answered as it was started
		}
	}
	close(stop)
	pump.Wait()
	if why == pipeline.ClientGone {
		_, _ = a.sched.Cancel(c.ID) // inferd call's Ctrl-C: the call runs here
		return
	}
	line := operatorCallLine{CallID: end.ID, State: end.State, Message: end.Message}
	if end.State == store.CallSucceeded {
		line.Outputs = outputsOf(end)
	}
	_ = json.NewEncoder(w).Encode(line)
}

// writeOutputs writes the backlog and then each line that comes on lines
// as an {"output": …} line, flushed, until stop is closed; what came by
// then is written too. A closed lines (a client that fell behind) ends the
// stream: the outputs come in the last line.
func writeOutputs(w http.ResponseWriter, backlog []json.RawMessage, lines <-chan streamEvent, stop <-chan struct{}) {
	enc := json.NewEncoder(w)
	rc := http.NewResponseController(w)
	for _, line := range backlog {
		_ = enc.Encode(operatorCallLine{Output: line})
	}
	_ = rc.Flush()
	write := func(ev streamEvent, ok bool) bool {
		if ok && ev.output != nil {
			_ = enc.Encode(operatorCallLine{Output: ev.output})
			_ = rc.Flush()
		}
		return ok
	}
	for {
		select {
		case ev, ok := <-lines:
			if !write(ev, ok) {
				return
			}
		case <-stop:
			for {
				select {
				case ev, ok := <-lines:
					if !write(ev, ok) {
						return
					}
				default:
					return
				}
			}
		}
	}
}

// outputsOf is a finished call's outputs as the Banana answer has them:
// each line of a streamed reply, or the one reply.
func outputsOf(c store.Call) []json.RawMessage {
	var out []json.RawMessage
	if err := json.Unmarshal(c.Outputs, &out); err == nil && c.Streamed {
		return out
	}
	return []json.RawMessage{c.Outputs}
}
