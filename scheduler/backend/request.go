package backend

import (
	"encoding/json"

	"inferd/store"
)

// Request is one call's request to a model (Instance.Infer): its inputs and
// everything else the call asks of the exchange, spelled out, so that a
// backend sees all a call carries in one place.
type Request struct {
	// Inputs is the body posted to the model, a JSON value.
	Inputs json.RawMessage
	// Route sends the call to that route of the model (for protocol
	// potassium, the handler of that route; for http, under the model's
	// inferPath; for openai, that path of the server) instead of inferPath
	// itself: the Banana Client's POST /run/PROJECT/ROUTE, an OpenAI
	// endpoint. "" is inferPath.
	Route string
	// Stream hears a streamed reply line by line; nil drops the lines (the
	// reply is still read whole).
	Stream Stream
	// Meter hears the token usage an OpenAI-compatible model reports; nil
	// when nobody counts it.
	Meter TokenMeter
}

// Stream hears a call's output as a streaming model sends it (the http
// protocol's application/x-ndjson replies, an OpenAI server's
// text/event-stream; see docs/protocols.md). Its methods are called on the
// goroutine running Instance.Infer and must not block.
type Stream interface {
	// Begin says that the reply streams: Infer's result will be the JSON
	// array of the lines.
	Begin()
	// Line is one line of output, a JSON value, as it arrived. The caller
	// may keep it.
	Line(line json.RawMessage)
}

// WarmupRoute is the route that warms a replica (Banana's Client.warmup):
// a Potassium app answers it itself, and for a model of protocol http a
// ready replica is warm, so its client answers it without the model.
const WarmupRoute = "/_k/warmup"

// TokenMeter hears the token counts an OpenAI-compatible model reports
// for a call (protocol openai: the reply's "usage", or a stream's last
// one). Called at most once, on the goroutine running Instance.Infer.
type TokenMeter interface {
	Tokens(t store.Tokens)
}
