package scheduler

import (
	"fmt"
	"strings"
)

// Failure is the kind of end a failed call's message tells, for answers
// that carry it as a status of their own (the OpenAI routes): the messages
// are made in this package, so they are read back here, next to them.
type Failure int

// Kinds of failure (Classify).
const (
	FailOther      Failure = iota // the model crashed, answered nonsense, ...
	FailCancelled                 // cancelled by request, or its queue purged
	FailExpired                   // not dispatched within its queueTimeout
	FailTimeout                   // inference timed out (its own or a replica neighbour's)
	FailModelHTTP                 // the model answered a non-2xx status
	FailNotStarted                // the model failed to start, or never can here
	FailRestart                   // interrupted by a daemon restart
)

// ModelFailure is what Classify reads from a failed call's message.
type ModelFailure struct {
	Kind Failure
	// Status and Body are the model's answer for FailModelHTTP (the first
	// KiB of its body).
	Status int
	Body   string
}

// Classify reads the kind of failure from a failed call's message.
func Classify(msg string) ModelFailure {
	const modelHTTP = "error: model returned HTTP "
	switch {
	case msg == msgCancelled || msg == msgQueuePurged:
		return ModelFailure{Kind: FailCancelled}
	case strings.HasPrefix(msg, "error: expired after ") && strings.HasSuffix(msg, "s in the queue"):
		return ModelFailure{Kind: FailExpired}
	case strings.HasPrefix(msg, "error: inference timed out after "),
		strings.HasPrefix(msg, "error: the replica was stopped because another call on it timed out"):
		return ModelFailure{Kind: FailTimeout}
	case strings.HasPrefix(msg, "error: model failed to start: "), strings.HasPrefix(msg, "error: project needs "):
		return ModelFailure{Kind: FailNotStarted}
	case msg == msgInterrupted:
		return ModelFailure{Kind: FailRestart}
	case strings.HasPrefix(msg, modelHTTP):
		f := ModelFailure{Kind: FailModelHTTP}
		rest := msg[len(modelHTTP):]
		n, _ := fmt.Sscanf(rest, "%d", &f.Status)
		if n != 1 {
			return ModelFailure{Kind: FailOther}
		}
		if _, body, ok := strings.Cut(rest, ": "); ok {
			f.Body = body
		}
		return f
	}
	return ModelFailure{}
}
