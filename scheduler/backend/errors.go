package backend

import (
	"errors"
	"fmt"
)

// ErrExited is returned by Instance.Infer when the replica ends during the call
// (or had ended before it). The error wraps it with the exit status.
var ErrExited = errors.New("model process exited")

// ErrInvalidReply is returned by Instance.Infer, wrapped with detail, when a
// 2xx reply is not JSON or is too large.
var ErrInvalidReply = errors.New("invalid reply from model")

// ErrNoLog is returned by Logs.TailLog for a log that does not exist.
var ErrNoLog = errors.New("no such replica log")

// HTTPError is returned by Instance.Infer when the model answers with a
// non-2xx status.
type HTTPError struct {
	Status int    // HTTP status code
	Body   string // the first KiB of the reply body
	// RetryAfter is the reply's Retry-After header as sent ("" when it had
	// none): a door passes it on unchanged.
	RetryAfter string
}

// Error implements error.
func (e *HTTPError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("model replied HTTP %d", e.Status)
	}
	return fmt.Sprintf("model replied HTTP %d: %s", e.Status, e.Body)
}

// ExceptionError reports an exception raised by the model's handler, for
// protocols that tell it apart from other errors (potassium's text/plain 500
// with a traceback). The http protocol never returns it: its failures are
// HTTPErrors.
type ExceptionError struct {
	LastLine string // the last line of the traceback, e.g. "ValueError: bad input"
}

// Error implements error.
func (e *ExceptionError) Error() string { return "model raised an exception: " + e.LastLine }

// OutOfMemoryError is how a replica ended when the kernel killed it, or a
// process of it, for going over the project's memoryMiB. Instance.ExitErr
// returns it, wrapping how the process ended (nil when it then exited
// cleanly).
type OutOfMemoryError struct {
	LimitMiB int
	Err      error
}

// Error implements error.
func (e *OutOfMemoryError) Error() string {
	if e.Err == nil {
		return fmt.Sprintf("out of memory (limit %d MiB)", e.LimitMiB)
	}
	return fmt.Sprintf("out of memory (limit %d MiB): %v", e.LimitMiB, e.Err)
}

// Unwrap returns how the process ended.
func (e *OutOfMemoryError) Unwrap() error { return e.Err }
