package httpapi

import (
	"encoding/json"
	"net/http"

	"github.com/julienschmidt/httprouter"
	"github.com/rs/zerolog"

	"inferd/httpapi/respond"
)

// The public API's names for the answer vocabulary it shares with the
// admin and status APIs (package respond): the doors' code reads as it
// did before the vocabulary became a package of its own, and the files
// that others change at the same time need no edit for it.

type errorBody = respond.ErrorBody

// Error codes of the JSON error body (respond.Code*).
const (
	codeBadRequest       = respond.CodeBadRequest
	codeUnauthorized     = respond.CodeUnauthorized
	codeForbidden        = respond.CodeForbidden
	codeNotFound         = respond.CodeNotFound
	codeMethodNotAllowed = respond.CodeMethodNotAllowed
	codeTooLarge         = respond.CodeTooLarge
	codeRateLimited      = respond.CodeRateLimited
	codeConflict         = respond.CodeConflict
	codeStorageFull      = respond.CodeStorageFull
	codeInternal         = respond.CodeInternal
	codeUnavailable      = respond.CodeUnavailable
	requestIDHeader      = respond.RequestIDHeader
	clusterUnavailable   = respond.ClusterUnavailable
)

var (
	errEmptyBody        = respond.ErrEmptyBody
	errNotObject        = respond.ErrNotObject
	errInvalidHeaderKey = respond.ErrInvalidKey
	errProjectNotFound  = respond.ErrProjectNotFound
	errNotYours         = respond.ErrNotYours
)

func malformedJSON(err error) error { return respond.MalformedJSON(err) }
func writeJSON(w http.ResponseWriter, status int, v any) {
	respond.JSON(w, status, v)
}
func writeBody(w http.ResponseWriter, status int, b []byte) { respond.Body(w, status, b) }
func writeError(w http.ResponseWriter, r *http.Request, log zerolog.Logger, err error) {
	respond.Error(w, r, log, err)
}
func requestIDOf(w http.ResponseWriter) string { return respond.RequestID(w) }
func failureMessage(m string) string           { return respond.FailureMessage(m) }
func truncate(s string, n int) string          { return respond.Truncate(s, n) }
func decodeObject(body []byte, v any) error    { return respond.DecodeObject(body, v) }
func isAbsent(raw json.RawMessage) bool        { return respond.IsAbsent(raw) }
func firstByte(b []byte) byte                  { return respond.FirstByte(b) }
func withRequestLog(next http.Handler, log zerolog.Logger) http.Handler {
	return respond.WithRequestLog(next, log)
}
func logPanic(w http.ResponseWriter, r *http.Request, log zerolog.Logger, v any) bool {
	return respond.LogPanic(w, r, log, v)
}
func newRouter(onPanic func(http.ResponseWriter, *http.Request, any)) *httprouter.Router {
	return respond.NewRouter(onPanic, routeError)
}
