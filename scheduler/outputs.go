package scheduler

import (
	"encoding/json"

	"inferd/store"
)

// OutputSink hears what clients following a call live want to know (the
// SSE events endpoint): that a replica has taken it, and each line of
// output a streaming model sends. Its methods run on the goroutine that
// runs the call on its replica, never the loop's, and must not block.
type OutputSink interface {
	// CallRunning reports that a replica is about to get the call.
	CallRunning(callID string)
	// CallOutput is one line of the call's streamed output, in order.
	CallOutput(callID string, line json.RawMessage)
}

type nopOutputs struct{}

func (nopOutputs) CallRunning(string)                 {}
func (nopOutputs) CallOutput(string, json.RawMessage) {}

// callStream is the backend.Stream and backend.TokenMeter of one Infer:
// it passes the lines on and remembers whether the reply streamed and the
// tokens the model reported. Only the goroutine running the Infer touches
// it.
type callStream struct {
	id     string
	sink   OutputSink
	began  bool
	tokens *store.Tokens
}

func (s *callStream) Begin()                    { s.began = true }
func (s *callStream) Line(line json.RawMessage) { s.sink.CallOutput(s.id, line) }
func (s *callStream) Tokens(t store.Tokens)     { s.tokens = &t }
