package openai

import (
	"fmt"
	"net/http"
	"strings"

	"inferd/scheduler"
	"inferd/store"
)

// StatusError is an error body with the HTTP status it goes with and the
// seconds of its Retry-After (0: none).
type StatusError struct {
	Status     int
	Body       ErrorBody
	RetryAfter int
}

// TypeOfStatus is the OpenAI error type of a status code.
func TypeOfStatus(status int) string {
	switch {
	case status == http.StatusUnauthorized:
		return TypeAuthentication
	case status == http.StatusForbidden:
		return TypePermission
	case status == http.StatusTooManyRequests:
		return TypeRateLimit
	case status == http.StatusServiceUnavailable:
		return TypeUnavailable
	case status == http.StatusGatewayTimeout:
		return TypeTimeout
	case status >= 500:
		return TypeServer
	default:
		return TypeInvalidRequest
	}
}

// CallFailure is the answer to a failed call, by what ended it
// (scheduler.Classify): the model's own error and status when it answered
// one (a 5xx but 503 as 502); 503 to retry when it never got a ready
// replica in time or a restart cut it; 503 when the model cannot start;
// 504 for a timeout; 409 for a cancelled call; 502 for anything else the
// model did (a crash, a reply that is not JSON).
func CallFailure(c store.Call) StatusError {
	msg := strings.TrimPrefix(c.Message, "error: ")
	if msg == "" {
		msg = "inference failed"
	}
	e := func(status int, typ, code string, retryAfter int) StatusError {
		return StatusError{Status: status, Body: NewError(typ, code, "", msg), RetryAfter: retryAfter}
	}
	f := scheduler.Classify(c.Message)
	switch f.Kind {
	case scheduler.FailModelHTTP:
		status, retry := f.Status, 0
		switch {
		case status == http.StatusServiceUnavailable:
			retry = 1
		case status >= 500 || status < 400:
			status = http.StatusBadGateway
		}
		out := e(status, TypeOfStatus(status), "", retry)
		if me, ok := ModelError([]byte(f.Body)); ok {
			out.Body = me
		}
		return out
	case scheduler.FailExpired:
		out := e(http.StatusServiceUnavailable, TypeUnavailable, "model_not_ready", 5)
		out.Body.Error.Message = fmt.Sprintf("the model did not get a ready replica within %ds (still booting, or busy); retry", c.QueueTimeout)
		return out
	case scheduler.FailRestart:
		return e(http.StatusServiceUnavailable, TypeUnavailable, "interrupted", 1)
	case scheduler.FailNotStarted:
		return e(http.StatusServiceUnavailable, TypeServer, "model_failed_to_start", 0)
	case scheduler.FailTimeout:
		return e(http.StatusGatewayTimeout, TypeTimeout, "timeout", 0)
	case scheduler.FailCancelled:
		return e(http.StatusConflict, TypeInvalidRequest, "cancelled", 0)
	default:
		return e(http.StatusBadGateway, TypeServer, "model_error", 0)
	}
}
