package httpapi

import (
	"bytes"
	"encoding/json"
)

// The start and check bodies are read without encoding/json's reflection:
// the body is checked once (json.Valid), then its top-level members are cut
// out as slices of it (eachMember), and those the API knows are kept as they
// are (inferenceRequest.set). This is what json.Unmarshal into a struct of
// json.RawMessage fields did, at a fraction of its cost per call: keys match
// a field exactly or, failing that, case-insensitively; of a repeated key
// the last value counts; unknown keys are ignored; a value is its bytes
// without surrounding space, null included.

// eachMember calls fn for each member of obj, in order: its key as written
// between the quotes (escaped: it holds a backslash escape) and its value, a
// slice of obj. obj must be a valid JSON object (json.Valid); it is never
// read past its end whatever it holds.
func eachMember(obj []byte, fn func(key []byte, escaped bool, value []byte)) {
	i := skipSpace(obj, 0)
	if i >= len(obj) || obj[i] != '{' {
		return
	}
	i++
	for {
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != '"' {
			return // '}' (or not an object after all)
		}
		end, escaped := stringEnd(obj, i)
		key := obj[i+1 : max(end-1, i+1)]
		i = skipSpace(obj, end)
		if i >= len(obj) || obj[i] != ':' {
			return
		}
		i = skipSpace(obj, i+1)
		start := i
		i = valueEnd(obj, i)
		fn(key, escaped, obj[start:i])
		i = skipSpace(obj, i)
		if i >= len(obj) || obj[i] != ',' {
			return
		}
		i++
	}
}

func skipSpace(b []byte, i int) int {
	for i < len(b) {
		switch b[i] {
		case ' ', '\t', '\r', '\n':
			i++
		default:
			return i
		}
	}
	return i
}

// stringEnd returns the index just past the string that starts at b[i]
// (a '"'), and whether it holds an escape.
func stringEnd(b []byte, i int) (int, bool) {
	escaped := false
	for i++; i < len(b); i++ {
		switch b[i] {
		case '\\':
			escaped = true
			i++
		case '"':
			return i + 1, escaped
		}
	}
	return len(b), escaped
}

// valueEnd returns the index just past the value that starts at b[i].
func valueEnd(b []byte, i int) int {
	if i >= len(b) {
		return i
	}
	switch b[i] {
	case '"':
		end, _ := stringEnd(b, i)
		return end
	case '{', '[':
		depth := 0
		for i < len(b) {
			switch b[i] {
			case '"':
				i, _ = stringEnd(b, i)
				continue
			case '{', '[':
				depth++
			case '}', ']':
				depth--
				if depth == 0 {
					return i + 1
				}
			}
			i++
		}
		return i
	}
	for i < len(b) { // a number, true, false or null
		switch b[i] {
		case ',', '}', ']', ' ', '\t', '\r', '\n':
			return i
		}
		i++
	}
	return i
}

// inferenceFields are the members of a start or check body, by name.
var inferenceFields = []string{"apiKey", "modelKey", "modelInputs", "startOnly", "callID", "longPoll",
	"timeout", "queueTimeout", "priority", "idempotencyKey", "webhook", "webhookEvents"}

// field is the field of r for the member named key exactly, or nil.
func (r *inferenceRequest) field(key []byte) *json.RawMessage {
	switch string(key) {
	case "apiKey":
		return &r.APIKey
	case "modelKey":
		return &r.ModelKey
	case "modelInputs":
		return &r.ModelInputs
	case "startOnly":
		return &r.StartOnly
	case "callID":
		return &r.CallID
	case "longPoll":
		return &r.LongPoll
	case "timeout":
		return &r.Timeout
	case "queueTimeout":
		return &r.QueueTimeout
	case "priority":
		return &r.Priority
	case "idempotencyKey":
		return &r.IdempotencyKey
	case "webhook":
		return &r.Webhook
	case "webhookEvents":
		return &r.WebhookEvents
	}
	return nil
}

// set keeps value in the field named key, matched as encoding/json matches
// it: exactly, else ignoring case; an unknown key is ignored.
func (r *inferenceRequest) set(key []byte, escaped bool, value []byte) {
	if escaped {
		var k string
		if json.Unmarshal(append(append([]byte{'"'}, key...), '"'), &k) != nil {
			return
		}
		key = []byte(k)
	}
	f := r.field(key)
	for i := 0; f == nil && i < len(inferenceFields); i++ {
		if bytes.EqualFold(key, []byte(inferenceFields[i])) {
			f = r.field([]byte(inferenceFields[i]))
		}
	}
	if f != nil {
		*f = value
	}
}

// decodeInferenceRequest reads body, which must be one JSON object, into a
// start or check request whose fields are slices of body.
func decodeInferenceRequest(body []byte) (inferenceRequest, error) {
	var req inferenceRequest
	switch firstByte(body) {
	case 0:
		return req, errEmptyBody
	case '{':
	default:
		if !json.Valid(body) {
			return req, malformedJSON(json.Unmarshal(body, new(any)))
		}
		return req, errNotObject
	}
	if !json.Valid(body) {
		return req, malformedJSON(json.Unmarshal(body, new(any)))
	}
	eachMember(body, req.set)
	return req, nil
}
