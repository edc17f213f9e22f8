package store

// FailureKind is how a failed call ended, in a word each front door maps to
// its own answer (an OpenAI status and error type, a /run status): set by
// the code that ends the call, where the cause is known, and kept in the
// call's record, so that no answer has to read it back out of Message.
type FailureKind string

// Kinds of failure. A record written before kinds were kept has none
// (Call.Failure nil): it reads as FailModel, the kind that promises least.
const (
	// FailModel: the model crashed, raised, answered something that is not
	// a reply, or the connection to it broke.
	FailModel FailureKind = "model"
	// FailModelStatus: the model answered a non-2xx status (Failure.Status,
	// Failure.Body, Failure.RetryAfter say how).
	FailModelStatus FailureKind = "model_status"
	// FailCancelled: cancelled by request (POST /cancel/v4, the admin API,
	// a queue purge). Final: no client should send it again.
	FailCancelled FailureKind = "cancelled"
	// FailDisconnected: the client of a stream went away (or read too
	// slowly), and its call was ended with it.
	FailDisconnected FailureKind = "disconnected"
	// FailExpired: not dispatched within its queue timeout.
	FailExpired FailureKind = "expired"
	// FailTimeout: ran past its inference timeout, or its replica was
	// stopped because another call on it did.
	FailTimeout FailureKind = "timeout"
	// FailNotStarted: the model failed to start, or can never run here
	// (more GPUs than the machine has).
	FailNotStarted FailureKind = "not_started"
	// FailInterrupted: cut by a daemon restart or shutdown, or by the loss
	// of the node that ran it (cluster mode); sending it again may succeed.
	FailInterrupted FailureKind = "interrupted"
	// FailInferd: inferd's own failure: the result could not be saved, the
	// inputs not read back, the project was deleted.
	FailInferd FailureKind = "inferd"
)

// Failure is how a failed call ended (Call.Failure).
type Failure struct {
	Kind FailureKind `json:"kind"`
	// Status is the model's HTTP status (FailModelStatus).
	Status int `json:"status,omitempty"`
	// RetryAfter is the model's Retry-After header as it sent it
	// (FailModelStatus), passed on by the doors unchanged.
	RetryAfter string `json:"retryAfter,omitempty"`
	// Body is the first KiB of the model's reply (FailModelStatus), which a
	// door that speaks the model's dialect passes on.
	Body string `json:"body,omitempty"`
}

// FailureOf is how c failed: its Failure, or FailModel for a record kept
// from before kinds were (see FailureKind). Zero for a call that did not
// fail.
func FailureOf(c Call) Failure {
	switch {
	case c.State != CallFailed:
		return Failure{}
	case c.Failure == nil:
		return Failure{Kind: FailModel}
	}
	return *c.Failure
}
