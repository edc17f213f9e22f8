package httpapi

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"strconv"

	"inferd/internal/jsonw"
)

// answer is an inference answer encoded in three parts, so that a call's
// outputs, the model's raw JSON as the store keeps it, go into it without
// being decoded, encoded again or copied: the head is the JSON object of
// every other field less its closing brace and the start of modelOutputs,
// then the outputs as they are, then the tail. A 5 MB result costs one
// copy (the store's read) and one write, where encoding it cost a
// validation, an escape pass and two more copies (see docs/benchmarks.md).
type answer struct {
	head, outputs, tail []byte
}

// Fixed pieces of the modelOutputs field.
var (
	outputsOpen  = []byte(`,"modelOutputs":[`)
	outputsField = []byte(`,"modelOutputs":`)
	outputsNull  = []byte(`,"modelOutputs":null`)
	outputsClose = []byte("]}")
	objectClose  = []byte("}")
)

// newAnswer encodes fields, a struct that encodes as a JSON object (an
// inference answer, or one with more fields, as a webhook body has), and
// adds "modelOutputs": [outputs] when succeeded, else null; when listed,
// outputs are the list already (a streamed call's lines). outputs must be
// valid JSON, as the store hands back what the model client checked; they
// are held, not copied, until the answer is written. This is the one way a
// call's result is written out: the start and check answers use it, and so
// can any other body that carries a result.
func newAnswer(fields any, outputs json.RawMessage, succeeded, listed bool) (answer, error) {
	var head []byte
	var err error
	if r, ok := fields.(inferenceResponse); ok {
		// Every start and check: written field by field (appendResponse).
		head = r.appendJSON(make([]byte, 0, responseSize+len(outputsOpen)))
	} else if head, err = json.Marshal(fields); err != nil {
		return answer{}, fmt.Errorf("encode answer: %w", err)
	}
	if len(head) < 2 || head[0] != '{' || head[len(head)-1] != '}' {
		return answer{}, fmt.Errorf("encode answer: %T is not a JSON object", fields)
	}
	if len(head) == 2 {
		return answer{}, fmt.Errorf("encode answer: %T has no field", fields)
	}
	return finishAnswer(head, outputs, succeeded, listed), nil
}

// finishAnswer is newAnswer's end: head, a JSON object with at least one
// field, ends open, followed by the modelOutputs field.
func finishAnswer(head []byte, outputs json.RawMessage, succeeded, listed bool) answer {
	head = head[:len(head)-1]
	if !succeeded {
		return answer{head: append(head, outputsNull...), tail: objectClose}
	}
	if listed {
		return answer{head: append(head, outputsField...), outputs: bytes.TrimSpace(outputs), tail: objectClose}
	}
	head = append(head, outputsOpen...)
	return answer{head: head, outputs: bytes.TrimSpace(outputs), tail: outputsClose}
}

// Bytes returns the answer in one buffer, for a body that is kept (a
// webhook's) rather than written at once.
func (a answer) Bytes() []byte {
	b := make([]byte, 0, a.Len())
	return append(append(append(b, a.head...), a.outputs...), a.tail...)
}

// Len is the answer's length in bytes, for Content-Length.
func (a answer) Len() int { return len(a.head) + len(a.outputs) + len(a.tail) }

// WriteTo writes the answer to w: one writev where w is a connection.
func (a answer) WriteTo(w io.Writer) (int64, error) {
	bufs := net.Buffers{a.head, a.outputs, a.tail}
	return bufs.WriteTo(w)
}

// responseSize is room enough for an inference answer's fields, most of the
// time: its buffer is allocated once.
const responseSize = 320

// appendJSON appends r as json.Marshal encodes it, field by field, in the
// struct's order: the answer of every start and check, where json.Marshal's
// reflection was a measurable part of a call's CPU.
// TestResponseEncodesAsJSONMarshal holds it to json.Marshal, every field set;
// a field added to inferenceResponse must be added here.
func (r inferenceResponse) appendJSON(dst []byte) []byte {
	dst = append(dst, `{"id":`...)
	dst = jsonw.String(dst, r.ID)
	dst = append(dst, `,"message":`...)
	dst = jsonw.String(dst, r.Message)
	dst = append(dst, `,"created":`...)
	dst = strconv.AppendInt(dst, r.Created, 10)
	dst = append(dst, `,"apiVersion":`...)
	dst = jsonw.String(dst, r.APIVersion)
	dst = append(dst, `,"callID":`...)
	dst = jsonw.String(dst, r.CallID)
	dst = append(dst, `,"finished":`...)
	dst = strconv.AppendBool(dst, r.Finished)
	if r.QueuePosition != nil {
		dst = append(dst, `,"queuePosition":`...)
		dst = strconv.AppendInt(dst, int64(*r.QueuePosition), 10)
	}
	if r.WaitingFor != nil {
		dst = append(dst, `,"waitingFor":{"code":`...)
		dst = jsonw.String(dst, r.WaitingFor.Code)
		dst = append(dst, `,"text":`...)
		dst = jsonw.String(dst, r.WaitingFor.Text)
		dst = append(dst, '}')
	}
	dst = optInt64(dst, `,"etaMs":`, r.EtaMs)
	if r.EtaRangeMs != nil {
		dst = append(dst, `,"etaRangeMs":[`...)
		dst = strconv.AppendInt(dst, r.EtaRangeMs[0], 10)
		dst = append(dst, ',')
		dst = strconv.AppendInt(dst, r.EtaRangeMs[1], 10)
		dst = append(dst, ']')
	}
	dst = optInt64(dst, `,"queueMs":`, r.QueueMs)
	dst = optInt64(dst, `,"bootMs":`, r.BootMs)
	dst = optInt64(dst, `,"runMs":`, r.RunMs)
	if r.BatchSize != nil {
		dst = append(dst, `,"batchSize":`...)
		dst = strconv.AppendInt(dst, int64(*r.BatchSize), 10)
	}
	dst = optInt64(dst, `,"batchWaitMs":`, r.BatchWaitMs)
	return append(dst, '}')
}

// optInt64 appends field and *n, or nothing for nil (omitempty).
func optInt64(dst []byte, field string, n *int64) []byte {
	if n == nil {
		return dst
	}
	return strconv.AppendInt(append(dst, field...), *n, 10)
}
