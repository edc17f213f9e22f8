package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"inferd/store"
)

// This file is the one place that turns errors into what a caller sees: an
// "error: ..." message on the inference endpoints, and a status code with a
// JSON error body on the project and admin endpoints.

// Error codes of the JSON error body {"error": {"code": ..., "message": ...}}.
const (
	codeBadRequest       = "bad_request"
	codeUnauthorized     = "unauthorized"
	codeNotFound         = "not_found"
	codeMethodNotAllowed = "method_not_allowed"
	codeTooLarge         = "payload_too_large"
	codeRateLimited      = "rate_limited"
	codeConflict         = "conflict"
	codeStorageFull      = "insufficient_storage"
	codeInternal         = "internal"
)

// userError is a failure caused by the request, whose text is written for the
// caller. On the inference endpoints only msg is shown (as "error: " + msg).
type userError struct {
	status int
	code   string
	msg    string
}

func (e *userError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &userError{http.StatusBadRequest, codeBadRequest, fmt.Sprintf(format, args...)}
}

func notFound(format string, args ...any) error {
	return &userError{http.StatusNotFound, codeNotFound, fmt.Sprintf(format, args...)}
}

// malformedJSON describes a json.Unmarshal failure for the caller.
func malformedJSON(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return badRequest("malformed JSON: %s (at byte %d)", se.Error(), se.Offset)
	case errors.As(err, &te) && te.Field != "":
		return badRequest("%s must be of type %s, not %s", te.Field, te.Type, te.Value)
	default:
		return badRequest("malformed JSON: %s", err.Error())
	}
}

// Request problems shared by every endpoint that reads a JSON body.
var (
	errEmptyBody = badRequest("request body is empty; send a JSON object")
	errNotObject = badRequest("request body must be a JSON object")
)

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
	errInvalidHeaderKey = &userError{http.StatusUnauthorized, codeUnauthorized, "invalid API key"}
	errProjectNotFound  = notFound("project not found")
	// errNotYours aborts an update of another team's project; it answers
	// exactly like a missing project so that its existence is never revealed.
	errNotYours = errors.New("project belongs to another team")
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
	var ue *userError
	var tooLarge *http.MaxBytesError
	var se *schedulerError
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return "error: " + clusterUnavailable, false
	case errors.As(err, &ue):
		return "error: " + ue.msg, false
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

// apiError returns the status code, error code and message for err on the
// project and admin endpoints, and whether err is an internal failure that
// the caller must log. requestID is quoted in internal-error messages so an
// operator can find the log line.
func apiError(err error, requestID string) (status int, code, msg string, internal bool) {
	var ue *userError
	var tooLarge *http.MaxBytesError
	var ve *store.ValidationError
	var qe *store.QuotaError
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return http.StatusServiceUnavailable, codeUnavailable, clusterUnavailable, false
	case errors.As(err, &ue):
		return ue.status, ue.code, ue.msg, false
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, codeTooLarge,
			fmt.Sprintf("request body is larger than %d bytes", tooLarge.Limit), false
	case errors.As(err, &ve):
		return http.StatusBadRequest, codeBadRequest, ve.Error(), false
	case errors.As(err, &qe):
		return http.StatusBadRequest, codeBadRequest, qe.Error(), false
	case errors.Is(err, errNotYours):
		return http.StatusNotFound, codeNotFound, errProjectNotFound.Error(), false
	case errors.Is(err, store.ErrInvalidKey):
		return http.StatusUnauthorized, codeUnauthorized, errInvalidHeaderKey.Error(), false
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound, codeNotFound, "not found", false
	case errors.Is(err, store.ErrConflict):
		return http.StatusConflict, codeConflict, err.Error(), false
	case errors.Is(err, store.ErrStorageFull):
		return http.StatusInsufficientStorage, codeStorageFull, "storage full; nothing was changed", false
	default:
		return http.StatusInternalServerError, codeInternal,
			"internal error; see the server log for request id " + requestID, true
	}
}
