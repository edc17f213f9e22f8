package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"inferd/scheduler/backend"
)

// errNoBatch is InferBatch's error for a potassium model: store validation
// refuses batch for that protocol, so reaching it is a bug, not a model's
// doing.
var errNoBatch = errors.New("infer: protocol potassium cannot take a batch")

// InferBatch posts the inputs of several calls to the model's BatchPath as
// {"batch": [inputs, ...]} and returns one item per input from its reply
// {"outputs": [output or {"error": "..."}, ...]}, in the same order (see
// docs/protocols.md "Batches"). Its errors are Infer's, and
// backend.ErrInvalidReply (wrapped) for a reply without an outputs list,
// with a list of another length, or that streams. Each input is valid
// JSON (the API checked it), so the body is built by joining them, never
// decoding them again.
func (c *Client) InferBatch(ctx context.Context, inputs []json.RawMessage) ([]backend.BatchItem, error) {
	if c.potassium {
		return nil, errNoBatch
	}
	reply, err := c.post(ctx, c.cfg.BatchPath, batchBody(inputs), nil, nil, false)
	if err != nil {
		return nil, err
	}
	return splitBatch(reply, len(inputs))
}

// batchBody is {"batch":[inputs...]}.
func batchBody(inputs []json.RawMessage) []byte {
	n := len(`{"batch":[]}`) + len(inputs)
	for _, in := range inputs {
		n += len(in)
	}
	body := make([]byte, 0, n)
	body = append(body, `{"batch":[`...)
	for i, in := range inputs {
		if i > 0 {
			body = append(body, ',')
		}
		body = append(body, in...)
	}
	return append(body, "]}"...)
}

// splitBatch reads a batch reply (valid JSON) into n items.
func splitBatch(reply json.RawMessage, n int) ([]backend.BatchItem, error) {
	var r struct {
		Outputs *[]json.RawMessage `json:"outputs"`
	}
	if err := json.Unmarshal(reply, &r); err != nil || r.Outputs == nil {
		return nil, fmt.Errorf("%w: a batch reply must be {\"outputs\": [...]}, got %q", backend.ErrInvalidReply, truncate(reply, 200))
	}
	outs := *r.Outputs
	if len(outs) != n {
		return nil, fmt.Errorf("%w: %d outputs for %d inputs", backend.ErrInvalidReply, len(outs), n)
	}
	items := make([]backend.BatchItem, n)
	for i, out := range outs {
		if msg, ok := itemError(out); ok {
			items[i].Err = msg
			continue
		}
		items[i].Output = out
	}
	return items, nil
}

// itemError reports whether out is a per-call error, an object whose only
// member is "error" with a string value, and returns its text (at most
// errorBodyBytes). Any other value, an object with an "error" member
// beside others included, is an output. It reads tokens, so an output that
// is a large object is not decoded to tell.
func itemError(out json.RawMessage) (string, bool) {
	dec := json.NewDecoder(bytes.NewReader(out))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return "", false
	}
	if key, err := dec.Token(); err != nil || key != "error" {
		return "", false
	}
	val, err := dec.Token()
	msg, isString := val.(string)
	if err != nil || !isString {
		return "", false
	}
	if end, err := dec.Token(); err != nil || end != json.Delim('}') {
		return "", false
	}
	return validUTF8(truncate([]byte(msg), errorBodyBytes)), true
}
