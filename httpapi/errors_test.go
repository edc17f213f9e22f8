package httpapi

import (
	"errors"
	"fmt"
	"net/http"
	"testing"

	"inferd/store"
)

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
