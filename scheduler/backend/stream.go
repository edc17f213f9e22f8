package backend

import (
	"context"
	"encoding/json"
)

// Stream hears a call's output as a streaming model sends it (the http
// protocol's application/x-ndjson replies; see docs/protocols.md). Its
// methods are called on the goroutine running Instance.Infer and must not
// block.
type Stream interface {
	// Begin says that the reply streams: Infer's result will be the JSON
	// array of the lines.
	Begin()
	// Line is one line of output, a JSON value, as it arrived. The caller
	// may keep it.
	Line(line json.RawMessage)
}

type streamKey struct{}

// WithStream returns a context for Instance.Infer whose streamed output
// goes to s. It travels in the context, as net/http/httptrace's hooks do,
// so that an Infer without one needs nothing new.
func WithStream(ctx context.Context, s Stream) context.Context {
	return context.WithValue(ctx, streamKey{}, s)
}

// StreamFrom returns the Stream of an Infer's context, or nil.
func StreamFrom(ctx context.Context) Stream {
	s, _ := ctx.Value(streamKey{}).(Stream)
	return s
}
