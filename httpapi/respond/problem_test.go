package respond

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"inferd/store"
)

func TestClassifyMapsErrorsToStatusCodeAndMessage(t *testing.T) {
	tests := []struct {
		name     string
		err      error
		status   int
		code     string
		msg      string
		internal bool
	}{
		{"user error", BadRequest("x is bad"), 400, CodeBadRequest, "x is bad", false},
		{"body too large", &http.MaxBytesError{Limit: 10}, 413, CodeTooLarge, "request body is larger than 10 bytes", false},
		{"validation", fmt.Errorf("update: %w", &store.ValidationError{Field: "maxReplicas", Reason: "must be at least 1"}), 400, CodeBadRequest, "maxReplicas: must be at least 1", false},
		{"another team's project", ErrNotYours, 404, CodeNotFound, "project not found", false},
		{"invalid key", fmt.Errorf("auth: %w", store.ErrInvalidKey), 401, CodeUnauthorized, "invalid API key", false},
		{"not found", fmt.Errorf("key k1: %w", store.ErrNotFound), 404, CodeNotFound, "not found", false},
		{"conflict", fmt.Errorf("modelKey taken: %w", store.ErrConflict), 409, CodeConflict, "modelKey taken: conflict", false},
		{"storage full", fmt.Errorf("put: %w", store.ErrStorageFull), 507, CodeStorageFull, "storage full; nothing was changed", false},
		{"anything else", errors.New("boom"), 500, CodeInternal, "internal error; see the server log for request id r1", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			status, code, msg, internal := Classify(tc.err, "r1")
			if status != tc.status || code != tc.code || msg != tc.msg || internal != tc.internal {
				t.Errorf("got %d %q %q %v, want %d %q %q %v", status, code, msg, internal, tc.status, tc.code, tc.msg, tc.internal)
			}
		})
	}
}
