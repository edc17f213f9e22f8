package openai

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
)

// EventStreamType is the Content-Type of a streamed reply.
const EventStreamType = "text/event-stream"

// IsEventStream reports whether a Content-Type header announces
// Server-Sent Events.
func IsEventStream(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == EventStreamType
}

// Done is the data of the event that ends an OpenAI stream.
const Done = "[DONE]"

// ErrTooLarge is ReadEvents' error for a stream over its limit.
var ErrTooLarge = errors.New("stream too large")

// ReadEvents reads Server-Sent Events from r until the stream ends or an
// event's data is [DONE], and hands each event's data (its data lines
// joined by newlines, as the SSE spec says) to fn as it arrives. Comments,
// ids, event names and retry lines are skipped: OpenAI streams carry
// everything in data. limit caps the bytes read. An error of fn ends the
// read with it. done reports whether the stream ended with [DONE].
func ReadEvents(r io.Reader, limit int64, fn func(data []byte) error) (done bool, err error) {
	br := bufio.NewReaderSize(io.LimitReader(r, limit+1), 64<<10)
	var total int64
	var data []byte
	have := false
	dispatch := func() error {
		if !have {
			return nil
		}
		d := data
		data, have = data[:0:0], false
		return fn(d)
	}
	for {
		line, rerr := br.ReadBytes('\n')
		total += int64(len(line))
		if total > limit {
			return false, fmt.Errorf("%w: larger than %d bytes", ErrTooLarge, limit)
		}
		line = bytes.TrimRight(line, "\r\n")
		switch {
		case len(line) == 0 && rerr == nil:
			if have && bytes.Equal(bytes.TrimSpace(data), []byte(Done)) {
				return true, nil
			}
			if err := dispatch(); err != nil {
				return false, err
			}
		case bytes.HasPrefix(line, []byte("data:")):
			v := bytes.TrimPrefix(line[len("data:"):], []byte(" "))
			if have {
				data = append(data, '\n')
			}
			data = append(data, v...)
			have = true
		}
		if rerr == io.EOF {
			// A stream cut after its last event's data but before the
			// blank line still delivers that event.
			if have && bytes.Equal(bytes.TrimSpace(data), []byte(Done)) {
				return true, nil
			}
			return false, dispatch()
		}
		if rerr != nil {
			return false, rerr
		}
	}
}
