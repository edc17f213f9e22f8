package respond

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"inferd/store"
)

// Error codes of the JSON error body {"error": {"code": ..., "message": ...}}.
const (
	CodeBadRequest       = "bad_request"
	CodeUnauthorized     = "unauthorized"
	CodeForbidden        = "forbidden"
	CodeNotFound         = "not_found"
	CodeMethodNotAllowed = "method_not_allowed"
	CodeTooLarge         = "payload_too_large"
	CodeRateLimited      = "rate_limited"
	CodeConflict         = "conflict"
	CodeStorageFull      = "insufficient_storage"
	CodeInternal         = "internal"
	CodeUnavailable      = "unavailable"
)

// ClusterUnavailable is the answer to etcd not answering, or to no node
// taking a request (cluster mode): the client's retry may find one.
const ClusterUnavailable = "cluster unavailable; retry"

// Problem is a failure caused by the request, whose text is written for
// the caller. On the inference endpoints only Msg is shown (as "error: " +
// Msg).
type Problem struct {
	Status int
	Code   string
	Msg    string
}

func (e *Problem) Error() string { return e.Msg }

// Answer is how the problem is answered (Answerer).
func (e *Problem) Answer() (status int, code, msg string) { return e.Status, e.Code, e.Msg }

// Answerer is an error that says how it is answered: its status, code and
// a message written for the caller. Classify answers any such error so;
// each API may have its own (httpapi's userError is one).
type Answerer interface {
	error
	Answer() (status int, code, msg string)
}

// BadRequest is a 400 with the message format makes.
func BadRequest(format string, args ...any) error {
	return &Problem{http.StatusBadRequest, CodeBadRequest, fmt.Sprintf(format, args...)}
}

// NotFound is a 404 with the message format makes.
func NotFound(format string, args ...any) error {
	return &Problem{http.StatusNotFound, CodeNotFound, fmt.Sprintf(format, args...)}
}

// MalformedJSON describes a json.Unmarshal failure for the caller.
func MalformedJSON(err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return BadRequest("malformed JSON: %s (at byte %d)", se.Error(), se.Offset)
	case errors.As(err, &te) && te.Field != "":
		return BadRequest("%s must be of type %s, not %s", te.Field, te.Type, te.Value)
	default:
		return BadRequest("malformed JSON: %s", err.Error())
	}
}

// Request problems shared by every endpoint that reads a JSON body.
var (
	ErrEmptyBody = BadRequest("request body is empty; send a JSON object")
	ErrNotObject = BadRequest("request body must be a JSON object")
)

// Answers every API gives alike.
var (
	ErrInvalidKey      = &Problem{http.StatusUnauthorized, CodeUnauthorized, "invalid API key"}
	ErrProjectNotFound = NotFound("project not found")
	// ErrNotYours aborts an update of another team's project; it answers
	// exactly like a missing project so that its existence is never
	// revealed.
	ErrNotYours = errors.New("project belongs to another team")
)

// Classify returns the status code, error code and message for err on the
// project, status and admin endpoints, and whether err is an internal
// failure that the caller must log. requestID is quoted in
// internal-error messages so an operator can find the log line.
func Classify(err error, requestID string) (status int, code, msg string, internal bool) {
	var ue Answerer
	var tooLarge *http.MaxBytesError
	var ve *store.ValidationError
	var qe *store.QuotaError
	switch {
	case errors.Is(err, store.ErrUnavailable):
		return http.StatusServiceUnavailable, CodeUnavailable, ClusterUnavailable, false
	case errors.As(err, &ue):
		status, code, msg := ue.Answer()
		return status, code, msg, false
	case errors.As(err, &tooLarge):
		return http.StatusRequestEntityTooLarge, CodeTooLarge,
			fmt.Sprintf("request body is larger than %d bytes", tooLarge.Limit), false
	case errors.As(err, &ve):
		return http.StatusBadRequest, CodeBadRequest, ve.Error(), false
	case errors.As(err, &qe):
		return http.StatusBadRequest, CodeBadRequest, qe.Error(), false
	case errors.Is(err, ErrNotYours):
		return http.StatusNotFound, CodeNotFound, ErrProjectNotFound.Error(), false
	case errors.Is(err, store.ErrInvalidKey):
		return http.StatusUnauthorized, CodeUnauthorized, ErrInvalidKey.Error(), false
	case errors.Is(err, store.ErrNotFound):
		return http.StatusNotFound, CodeNotFound, "not found", false
	case errors.Is(err, store.ErrConflict):
		return http.StatusConflict, CodeConflict, err.Error(), false
	case errors.Is(err, store.ErrStorageFull):
		return http.StatusInsufficientStorage, CodeStorageFull, "storage full; nothing was changed", false
	default:
		return http.StatusInternalServerError, CodeInternal,
			"internal error; see the server log for request id " + requestID, true
	}
}
