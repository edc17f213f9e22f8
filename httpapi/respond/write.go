package respond

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/rs/zerolog"
)

// JSON writes v as the JSON body with the given status.
func JSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only a bug (an unencodable value) gets here; answer something
		// well-formed rather than half a body.
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"internal error: encoding the response failed"}}`)
	}
	Body(w, status, b)
}

// Body writes an encoded JSON body.
func Body(w http.ResponseWriter, status int, b []byte) {
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b) // a failed write means the client is gone
}

// ErrorBody is the JSON error shape of the project, status and admin
// endpoints.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail is an ErrorBody's error.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// Refusal is the ErrorBody of code and msg.
func Refusal(code, msg string) ErrorBody {
	return ErrorBody{Error: ErrorDetail{Code: code, Message: msg}}
}

// Error answers err on the project, status and admin endpoints, logging it
// when it is internal (the one place such an error is handled).
func Error(w http.ResponseWriter, r *http.Request, log zerolog.Logger, err error) {
	id := RequestID(w)
	status, code, msg, internal := Classify(err, id)
	if internal {
		log.Error().Err(err).Str("request_id", id).Str("method", r.Method).
			Str("path", r.URL.Path).Msg("request failed")
	}
	JSON(w, status, Refusal(code, msg))
}
