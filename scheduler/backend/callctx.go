package backend

// What an Infer takes besides its inputs travels in its context, as
// net/http/httptrace's hooks do, so that a backend that has no use for
// it needs nothing new: the Stream that hears a streamed reply, and the
// route of a call to a route other than inferPath.

import (
	"context"
	"encoding/json"

	"inferd/store"
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

type routeKey struct{}

// WarmupRoute is the route that warms a replica (Banana's Client.warmup):
// a Potassium app answers it itself, and for a model of protocol http a
// ready replica is warm, so its client answers it without the model.
const WarmupRoute = "/_k/warmup"

// WithRoute returns a context for Instance.Infer that sends the call to
// route of the model (for protocol potassium, the handler of that route;
// for http, under the model's inferPath) instead of inferPath itself:
// the Banana Client's POST /run/PROJECT/ROUTE.
func WithRoute(ctx context.Context, route string) context.Context {
	return context.WithValue(ctx, routeKey{}, route)
}

// RouteFrom returns the route of an Infer's context, or "".
func RouteFrom(ctx context.Context) string {
	r, _ := ctx.Value(routeKey{}).(string)
	return r
}

// TokenMeter hears the token counts an OpenAI-compatible model reports
// for a call (protocol openai: the reply's "usage", or a stream's last
// one). Called at most once, on the goroutine running Instance.Infer.
type TokenMeter interface {
	Tokens(t store.Tokens)
}

type meterKey struct{}

// WithTokenMeter returns a context for Instance.Infer whose reported token
// usage goes to m.
func WithTokenMeter(ctx context.Context, m TokenMeter) context.Context {
	return context.WithValue(ctx, meterKey{}, m)
}

// TokenMeterFrom returns the TokenMeter of an Infer's context, or nil.
func TokenMeterFrom(ctx context.Context) TokenMeter {
	m, _ := ctx.Value(meterKey{}).(TokenMeter)
	return m
}
