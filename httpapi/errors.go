package httpapi

import (
	"errors"
	"fmt"
	"net/http"

	"inferd/httpapi/respond"
	"inferd/store"
)

// This file is the one place that turns errors into what a caller sees: an
// "error: ..." message on the inference endpoints, and a status code with a
// JSON error body on the project and admin endpoints.

// userError is a failure caused by the request, whose text is written for
// the caller: the public API's respond.Problem, which respond.Classify
// answers alike (Answer). On the inference endpoints only msg is shown (as
// "error: " + msg).
type userError struct {
	status int
	code   string
	msg    string
}

func (e *userError) Error() string { return e.msg }

// Answer is how the error is answered (respond.Answerer).
func (e *userError) Answer() (status int, code, msg string) { return e.status, e.code, e.msg }

func badRequest(format string, args ...any) error {
	return &userError{http.StatusBadRequest, codeBadRequest, fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &userError{http.StatusNotFound, codeNotFound, fmt.Sprintf(format, args...)}
}

// Inference failures; their texts are the "error: ..." messages.
var (
	errMissingAPIKey   = badRequest("missing apiKey")
	errInvalidAPIKey   = &userError{http.StatusUnauthorized, codeUnauthorized, "invalid apiKey"}
	errMissingModelKey = badRequest("missing modelKey")
	errUnknownModelKey = notFound("unknown modelKey")
	errMissingInputs   = badRequest("missing modelInputs; send a JSON object")
	errInputsNotObject = badRequest("modelInputs must be a JSON object")
	errMissingCallID   = badRequest("missing callID")
	errCallNotFound    = notFound("callID not found (unknown, expired, or not yours)")
)

// Project API failures.
var (
	errMissingHeaderKey = &userError{http.StatusUnauthorized, codeUnauthorized,
		"missing API key: send it in the X-Service-API-Key header"}
)

// schedulerError marks an error returned by Scheduler.Submit. The scheduler's
// own errors (queue full, not enough GPUs) carry texts written for users and
// are shown as they are; store errors underneath are mapped like any other.
type schedulerError struct{ err error }

func (e *schedulerError) Error() string { return e.err.Error() }
func (e *schedulerError) Unwrap() error { return e.err }

// isStoreError reports whether err wraps one of the store's sentinels.
func isStoreError(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrInvalidKey) ||
		errors.Is(err, store.ErrStorageFull) || errors.Is(err, store.ErrConflict) ||
		errors.Is(err, store.ErrClosed)
}

// inferenceMessage returns the "error: ..." message for err, and whether err
// is an internal failure that the caller must log.
func inferenceMessage(err error) (msg string, internal bool) {
	var ue respond.Answerer
	var tooLarge *http.MaxBytesError
	var se *schedulerError
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return "error: " + respond.ClusterUnavailable, false
	case errors.As(err, &ue):
		_, _, msg := ue.Answer()
		return "error: " + msg, false
	case errors.As(err, &tooLarge):
		return fmt.Sprintf("error: request body is larger than %d bytes", tooLarge.Limit), false
	case errors.Is(err, store.ErrStorageFull):
		return "error: storage full; the call was not accepted", false
	case errors.As(err, &se) && !isStoreError(err):
		return "error: " + se.err.Error(), false
	default:
		return "error: internal error: " + err.Error(), true
	}
}

// inferenceStatus is the HTTP status of an inference answer that failed
// with err: 200, as the Banana clients need to read the message, except
// for the cluster being unavailable (etcd not answering, or no node to
// take the call: cluster mode), a 503 that a load balancer in front of
// the nodes may retry on another node; the body is the same JSON answer,
// "error: cluster unavailable; retry".
func inferenceStatus(err error) int {
	if errors.Is(err, store.ErrUnavailable) || errors.Is(err, errClusterUnavailable) {
		return http.StatusServiceUnavailable
	}
	return http.StatusOK
}
