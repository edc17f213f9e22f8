package protocol

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"

	"inferd/scheduler/backend"
	"inferd/store"
)

// ndjsonType is the Content-Type of a streamed reply: one JSON value per
// line (https://github.com/ndjson/ndjson-spec).
const ndjsonType = "application/x-ndjson"

// isNDJSON reports whether a Content-Type header announces a streamed reply.
func isNDJSON(ct string) bool {
	if ct == "application/json" || ct == "" {
		return false // the usual reply, told without parsing
	}
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == ndjsonType
}

// readStream reads a streamed reply to its end: each non-empty line must be
// a JSON value, and goes to s (which may be nil) as it arrives. It returns
// the JSON array of the lines, which is the call's result; limit caps the
// whole reply, as it caps a reply read at once. clean reports whether the
// body was read to its end.
func readStream(ctx context.Context, body io.Reader, limit int64, s backend.Stream) (out json.RawMessage, clean bool, err error) {
	if s != nil {
		s.Begin()
	}
	r := bufio.NewReaderSize(io.LimitReader(body, limit+1), 64<<10)
	var total int64
	arr := bytes.NewBufferString("[")
	n := 0
	for {
		line, err := r.ReadBytes('\n')
		total += int64(len(line))
		if total > limit {
			return nil, false, fmt.Errorf("%w: streamed reply larger than %d bytes", backend.ErrInvalidReply, limit)
		}
		if l := bytes.TrimSpace(line); len(l) > 0 {
			if !json.Valid(l) {
				return nil, false, fmt.Errorf("%w: streamed line %d is not JSON: %q", backend.ErrInvalidReply, n+1, truncate(l, 200))
			}
			if i := store.InvalidUTF8(l); i >= 0 {
				return nil, false, fmt.Errorf("%w: streamed line %d is not valid UTF-8 at byte %d", backend.ErrInvalidReply, n+1, i)
			}
			if n > 0 {
				arr.WriteByte(',')
			}
			arr.Write(l)
			n++
			if s != nil {
				s.Line(bytes.Clone(l))
			}
		}
		if errors.Is(err, io.EOF) {
			arr.WriteByte(']')
			return arr.Bytes(), true, nil
		}
		if err != nil {
			return nil, false, broken(ctx, err)
		}
	}
}
