package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"inferd/openai"
	"inferd/scheduler/backend"
	"inferd/store"
)

// Protocol openai: an OpenAI-compatible server (docs/openai.md). A call
// goes to its route, the OpenAI path the client asked for
// (/v1/chat/completions, ...), with the request as inferd rewrote it; a
// reply is JSON as for http, or Server-Sent Events when the request
// streams. Either way the usage the server reports goes to the call's
// backend.TokenMeter.

// readEventStream reads a streamed reply to its end ([DONE] or the end of
// the body): each event's data must be a JSON value and goes to s as it
// arrives; the result is the JSON array of the chunks, and the last usage
// a chunk carries goes to m. clean reports whether the body was read to
// its end.
func readEventStream(ctx context.Context, body io.Reader, limit int64, s backend.Stream, m backend.TokenMeter) (out json.RawMessage, clean bool, err error) {
	if s != nil {
		s.Begin()
	}
	arr := bytes.NewBufferString("[")
	n := 0
	var tokens *store.Tokens
	_, err = openai.ReadEvents(body, limit, func(data []byte) error {
		chunk := bytes.TrimSpace(data)
		if !json.Valid(chunk) {
			return fmt.Errorf("%w: streamed event %d is not JSON: %q", backend.ErrInvalidReply, n+1, truncate(chunk, 200))
		}
		if i := store.InvalidUTF8(chunk); i >= 0 {
			return fmt.Errorf("%w: streamed event %d is not valid UTF-8 at byte %d", backend.ErrInvalidReply, n+1, i)
		}
		if n > 0 {
			arr.WriteByte(',')
		}
		arr.Write(chunk)
		n++
		if t, ok := openai.Usage(chunk); ok {
			tokens = &t
		}
		if s != nil {
			s.Line(bytes.Clone(chunk))
		}
		return nil
	})
	switch {
	case errors.Is(err, openai.ErrTooLarge):
		return nil, false, fmt.Errorf("%w: streamed reply %v", backend.ErrInvalidReply, err)
	case errors.Is(err, backend.ErrInvalidReply):
		return nil, false, err
	case err != nil:
		return nil, false, broken(ctx, err)
	}
	if tokens != nil && m != nil {
		m.Tokens(*tokens)
	}
	arr.WriteByte(']')
	return arr.Bytes(), true, nil
}

// meterReply hands the usage of a whole reply to m.
func meterReply(reply []byte, m backend.TokenMeter) {
	if m == nil {
		return
	}
	if t, ok := openai.Usage(reply); ok {
		m.Tokens(t)
	}
}
