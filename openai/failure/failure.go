// Package failure tells what a failed call's answer is on the OpenAI
// routes and in a batch's error file: the status and OpenAI error body of
// how it ended. It reads the scheduler's messages (scheduler.Classify), so
// it is apart from package openai, which the model protocol client uses
// and which must not import the scheduler.
package failure

import (
	"fmt"
	"net/http"
	"strings"

	"inferd/openai"
	"inferd/scheduler"
	"inferd/store"
)

// Of is the answer to a failed call, by what ended it
// (scheduler.Classify): the model's own error and status when it answered
// one (a 5xx but 503 as 502); 503 to retry when it never got a ready
// replica in time or a restart cut it; 503 when the model cannot start;
// 504 for a timeout; 409 for a cancelled call; 502 for anything else the
// model did (a crash, a reply that is not JSON).
func Of(c store.Call) openai.StatusError {
	msg := strings.TrimPrefix(c.Message, "error: ")
	if msg == "" {
		msg = "inference failed"
	}
	e := func(status int, typ, code string, retryAfter int) openai.StatusError {
		return openai.StatusError{Status: status, Body: openai.NewError(typ, code, "", msg), RetryAfter: retryAfter}
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
		out := e(status, openai.TypeOfStatus(status), "", retry)
		if me, ok := openai.ModelError([]byte(f.Body)); ok {
			out.Body = me
		}
		return out
	case scheduler.FailExpired:
		out := e(http.StatusServiceUnavailable, openai.TypeUnavailable, "model_not_ready", 5)
		out.Body.Error.Message = fmt.Sprintf("the model did not get a ready replica within %ds (still booting, or busy); retry", c.QueueTimeout)
		return out
	case scheduler.FailRestart:
		return e(http.StatusServiceUnavailable, openai.TypeUnavailable, "interrupted", 1)
	case scheduler.FailNotStarted:
		return e(http.StatusServiceUnavailable, openai.TypeServer, "model_failed_to_start", 0)
	case scheduler.FailTimeout:
		return e(http.StatusGatewayTimeout, openai.TypeTimeout, "timeout", 0)
	case scheduler.FailCancelled:
		return e(http.StatusConflict, openai.TypeInvalidRequest, "cancelled", 0)
	default:
		return e(http.StatusBadGateway, openai.TypeServer, "model_error", 0)
	}
}
