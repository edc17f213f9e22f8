package openai

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"inferd/store"
)

// StatusError is an error body with the HTTP status it goes with and its
// Retry-After ("": none), as a model sent it or in seconds.
type StatusError struct {
	Status     int
	Body       ErrorBody
	RetryAfter string
	// Final says no client should send the request again (a cancelled
	// call): the answer carries x-should-retry: false, which the openai
	// SDKs read before their status rules, on a status none of the SDKs
	// retries.
	Final bool
}

// StatusCancelled is the status of a call cancelled by request: a 400,
// since every client retries some other status (openai-node and the AI
// SDK 408, 409, 429 and 5xx; LangChain all but 400-407 and 409), and a
// cancel undone by a retry runs the model again.
const StatusCancelled = http.StatusBadRequest

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

// CallFailure is the OpenAI answer to failed call c, by its failure kind
// (store.FailureOf): the model's own error, status and Retry-After when it
// answered one (a 5xx but 503 as 502); 503 to retry when it never got a
// ready replica in time or a restart cut it; 503 when the model cannot
// start; 504 for a timeout; a final 400 for a cancelled call (or one
// whose client went away); 502 for anything else the model did (a
// crash, a reply that is not JSON) and 500 for inferd's own failures.
// The message is the call's, which the scheduler writes for users and
// which never carries a Go error's text.
func CallFailure(c store.Call) StatusError {
	msg := strings.TrimPrefix(c.Message, "error: ")
	if msg == "" {
		msg = "inference failed"
	}
	e := func(status int, typ, code string, retryAfter int) StatusError {
		out := StatusError{Status: status, Body: NewError(typ, code, "", msg)}
		if retryAfter > 0 {
			out.RetryAfter = strconv.Itoa(retryAfter)
		}
		return out
	}
	f := store.FailureOf(c)
	switch f.Kind {
	case store.FailModelStatus:
		status := f.Status
		if status >= 500 && status != http.StatusServiceUnavailable || status < 400 {
			status = http.StatusBadGateway
		}
		out := e(status, TypeOfStatus(status), "", 0)
		if status == f.Status || status == http.StatusServiceUnavailable {
			out.RetryAfter = f.RetryAfter // the model's own, unchanged
		}
		if me, ok := ModelError([]byte(f.Body)); ok {
			out.Body = me
		}
		return out
	case store.FailExpired:
		out := e(http.StatusServiceUnavailable, TypeUnavailable, "model_not_ready", 5)
		out.Body.Error.Message = fmt.Sprintf("the model did not get a ready replica within %ds (still booting, or busy); retry", c.QueueTimeout)
		return out
	case store.FailInterrupted:
		return e(http.StatusServiceUnavailable, TypeUnavailable, "interrupted", 1)
	case store.FailNotStarted:
		return e(http.StatusServiceUnavailable, TypeServer, "model_failed_to_start", 0)
	case store.FailTimeout:
		return e(http.StatusGatewayTimeout, TypeTimeout, "timeout", 0)
	case store.FailCancelled, store.FailDisconnected:
		out := e(StatusCancelled, TypeInvalidRequest, "cancelled", 0)
		out.Final = true
		return out
	case store.FailInferd:
		return e(http.StatusInternalServerError, TypeServer, "internal_error", 0)
	default:
		return e(http.StatusBadGateway, TypeServer, "model_error", 0)
	}
}
