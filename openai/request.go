package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// The endpoints inferd serves and passes on to a model, by path.
const (
	ChatCompletions = "/v1/chat/completions"
	Completions     = "/v1/completions"
	Embeddings      = "/v1/embeddings"
)

// Endpoints are the paths a call may go to (a request's URL, a batch's
// endpoint).
var Endpoints = []string{ChatCompletions, Completions, Embeddings}

// Streams reports whether requests to endpoint may ask for a stream.
func Streams(endpoint string) bool { return endpoint != Embeddings }

// Request is what inferd reads of a request body, and the body to send the
// model.
type Request struct {
	// Model is the name the client asked for.
	Model string
	// Stream: the client asked for Server-Sent Events.
	Stream bool
	// AddedUsage: the client streams without asking for the usage chunk
	// (stream_options.include_usage), which inferd asks for to count the
	// tokens; the chunk is not passed back (see UsageOnly).
	AddedUsage bool

	fields map[string]json.RawMessage // the body, stream_options set
	raw    []byte                     // the body as the client sent it
}

// RequestError is a request body inferd refuses; Param names the field.
type RequestError struct {
	Param string
	Msg   string
}

func (e *RequestError) Error() string { return e.Msg }

// ParseRequest reads a request body for endpoint: a JSON object with a
// string "model"; unknown fields pass through unread (see Body).
func ParseRequest(endpoint string, body []byte) (Request, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(body, &fields); err != nil || fields == nil {
		return Request{}, &RequestError{Msg: "the request body must be a JSON object: " + jsonProblem(err)}
	}
	var req Request
	if err := json.Unmarshal(fields["model"], &req.Model); err != nil || req.Model == "" {
		return Request{}, &RequestError{Param: "model", Msg: "you must provide a model parameter (a string)"}
	}
	if raw, ok := fields["stream"]; ok && !isNull(raw) {
		if err := json.Unmarshal(raw, &req.Stream); err != nil {
			return Request{}, &RequestError{Param: "stream", Msg: "stream must be a boolean"}
		}
	}
	if req.Stream && !Streams(endpoint) {
		return Request{}, &RequestError{Param: "stream", Msg: endpoint + " does not stream"}
	}
	if req.Stream {
		var opts map[string]json.RawMessage
		if raw, ok := fields["stream_options"]; ok && !isNull(raw) {
			if err := json.Unmarshal(raw, &opts); err != nil || opts == nil {
				return Request{}, &RequestError{Param: "stream_options", Msg: "stream_options must be an object"}
			}
		}
		var include bool
		if raw, ok := opts["include_usage"]; ok && !isNull(raw) {
			if err := json.Unmarshal(raw, &include); err != nil {
				return Request{}, &RequestError{Param: "stream_options.include_usage", Msg: "stream_options.include_usage must be a boolean"}
			}
		}
		if !include {
			if opts == nil {
				opts = map[string]json.RawMessage{}
			}
			opts["include_usage"] = json.RawMessage("true")
			fields["stream_options"], _ = json.Marshal(opts)
			req.AddedUsage = true
		}
	}
	req.fields, req.raw = fields, body
	return req, nil
}

// Body is the request for the model: the client's, with "model" set to
// served (the name the server knows; "" keeps the client's) and, where
// AddedUsage, stream_options.include_usage set.
func (r Request) Body(served string) (json.RawMessage, error) {
	if (served == "" || served == r.Model) && !r.AddedUsage && r.raw != nil {
		return r.raw, nil // nothing to change: the body as it came
	}
	fields := r.fields
	if served != "" {
		fields = make(map[string]json.RawMessage, len(r.fields))
		for k, v := range r.fields {
			fields[k] = v
		}
		fields["model"], _ = json.Marshal(served)
	}
	b, err := json.Marshal(fields)
	if err != nil {
		return nil, fmt.Errorf("encode the request: %w", err)
	}
	return b, nil
}

func isNull(raw json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(raw), []byte("null")) }

// jsonProblem says what is wrong with a body json.Unmarshal refused.
func jsonProblem(err error) string {
	var se *json.SyntaxError
	switch {
	case err == nil:
		return "got null"
	case errors.As(err, &se):
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	default:
		return err.Error()
	}
}
