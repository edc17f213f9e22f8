package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"inferd/store"
)

func TestAPIErrorMapping(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		status   int
		code     string
		msg      string
		internal bool
	}{
		{"user error", badRequest("x is bad"), 400, codeBadRequest, "x is bad", false},
		{"body too large", &http.MaxBytesError{Limit: 10}, 413, codeTooLarge, "request body is larger than 10 bytes", false},
		{"validation", fmt.Errorf("update: %w", &store.ValidationError{Field: "maxReplicas", Reason: "must be at least 1"}), 400, codeBadRequest, "maxReplicas: must be at least 1", false},
		{"another team's project", errNotYours, 404, codeNotFound, "project not found", false},
		{"invalid key", fmt.Errorf("auth: %w", store.ErrInvalidKey), 401, codeUnauthorized, "invalid API key", false},
		{"not found", fmt.Errorf("key k1: %w", store.ErrNotFound), 404, codeNotFound, "not found", false},
		{"conflict", fmt.Errorf("modelKey taken: %w", store.ErrConflict), 409, codeConflict, "modelKey taken: conflict", false},
		{"storage full", fmt.Errorf("put: %w", store.ErrStorageFull), 507, codeStorageFull, "storage full; nothing was changed", false},
		{"anything else", errors.New("boom"), 500, codeInternal, "internal error; see the server log for request id r1", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, code, msg, internal := apiError(tc.err, "r1")
			if status != tc.status || code != tc.code || msg != tc.msg || internal != tc.internal {
				t.Errorf("got %d %q %q %v, want %d %q %q %v", status, code, msg, internal, tc.status, tc.code, tc.msg, tc.internal)
			}
		})
	}
}

func TestInferenceMessageMapping(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		msg      string
		internal bool
	}{
		{"user error", errUnknownModelKey, "error: unknown modelKey", false},
		{"body too large", &http.MaxBytesError{Limit: 99}, "error: request body is larger than 99 bytes", false},
		{"scheduler text passes through", &schedulerError{errors.New("queue full (3 calls waiting); retry later")}, "error: queue full (3 calls waiting); retry later", false},
		{"storage full from scheduler", &schedulerError{fmt.Errorf("save: %w", store.ErrStorageFull)}, "error: storage full; the call was not accepted", false},
		{"store error from scheduler", &schedulerError{fmt.Errorf("save: %w", store.ErrClosed)}, "error: internal error: save: store closed", true},
		{"store error elsewhere", fmt.Errorf("lookup: %w", store.ErrConflict), "error: internal error: lookup: conflict", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			msg, internal := inferenceMessage(tc.err)
			if msg != tc.msg || internal != tc.internal {
				t.Errorf("got %q %v, want %q %v", msg, internal, tc.msg, tc.internal)
			}
		})
	}
}
