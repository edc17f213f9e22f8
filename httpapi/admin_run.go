package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/scheduler"
	"inferd/store"
)

// CallRunner is what the admin API's call route needs of the scheduler:
// *scheduler.Scheduler has it.
type CallRunner interface {
	Start(ctx context.Context, p store.Project, req scheduler.Request) (store.Call, error)
	Lookup(id string) (store.Call, <-chan struct{}, error)
}

// WithCalls serves POST /admin/projects/:id/call (inferd call) with the
// daemon's scheduler and its output streams. The CLI with no daemon, and a
// cluster's node (whose project may run on another node), have none: the
// route then answers 501 saying what to use.
func WithCalls(run CallRunner, streams *Streams) AdminOption {
	return func(a *admin) { a.run, a.streams = run, streams }
}

// adminCallLine is one line of the call route's answer: an output line the
// model streamed (Output), or the call's end (the other fields).
type adminCallLine struct {
	Output  json.RawMessage   `json:"output,omitempty"`
	CallID  string            `json:"callID,omitempty"`
	State   store.CallState   `json:"state,omitempty"`
	Message string            `json:"message,omitempty"`
	Outputs []json.RawMessage `json:"outputs,omitempty"`
}

// runCall handles POST /admin/projects/:id/call[?stream=1]: the body is the
// call's inputs (any JSON; empty is {}). It makes a durable call of the
// project, as a start does, waits for its end, and answers one JSON line
// with its callID, state, message and outputs; with stream=1, first a line
// {"output": …} for each line the model streams as it streams it. A client
// that goes away before the end cancels the call (inferd call's Ctrl-C).
func (a *admin) runCall(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	if a.run == nil {
		writeError(w, r, a.log, &userError{http.StatusNotImplemented, codeInternal,
			"inferd call needs a running daemon on a single box (in a cluster, call the model through the HTTP API: POST /run/PROJECT with a key)"})
		return
	}
	p, err := a.store.GetProject(ps.ByName("id"))
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = notFound("project %s not found", truncate(ps.ByName("id"), 64))
		}
		writeError(w, r, a.log, err)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxAdminBody))
	if err != nil {
		writeError(w, r, a.log, badRequest("read the inputs: %v", err))
		return
	}
	inputs := json.RawMessage(bytes.TrimSpace(body))
	if len(inputs) == 0 {
		inputs = json.RawMessage("{}")
	}
	if !json.Valid(inputs) {
		writeError(w, r, a.log, badRequest("the inputs are not valid JSON"))
		return
	}
	c, err := a.run.Start(context.WithoutCancel(r.Context()), p, scheduler.Request{Inputs: inputs})
	if err != nil {
		msg, _ := inferenceMessage(&schedulerError{err})
		writeError(w, r, a.log, &userError{http.StatusServiceUnavailable, "unavailable", msg})
		return
	}
	stream := r.URL.Query().Get("stream") == "1"
	var sub *subscriber
	var backlog []json.RawMessage
	if stream && a.streams != nil {
		var cancel func()
		_, backlog, sub, cancel = a.streams.subscribe(c.ID)
		defer cancel()
	}
	_, done, err := a.run.Lookup(c.ID)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	rc := http.NewResponseController(w)
	_ = rc.SetWriteDeadline(time.Time{}) // as long as the call takes
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	enc := json.NewEncoder(w)
	for _, line := range backlog {
		_ = enc.Encode(adminCallLine{Output: line})
	}
	_ = rc.Flush()
	var events <-chan streamEvent
	if sub != nil {
		events = sub.ch
	}
	for !isClosed(done) {
		select {
		case ev, ok := <-events:
			if !ok {
				events = nil // fell behind: the outputs come at the end
				continue
			}
			if ev.output != nil {
				_ = enc.Encode(adminCallLine{Output: ev.output})
				_ = rc.Flush()
			}
		case <-done:
		case <-r.Context().Done():
			if a.cancel != nil {
				_, _ = a.cancel(c.ID)
			}
			return
		}
	}
	end, _, err := a.run.Lookup(c.ID)
	if err != nil {
		end = c
	}
	line := adminCallLine{CallID: end.ID, State: end.State, Message: end.Message}
	if end.State == store.CallSucceeded {
		line.Outputs = outputsOf(end)
	}
	_ = enc.Encode(line)
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
