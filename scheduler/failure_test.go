package scheduler

import (
	"errors"
	"testing"

	"inferd/scheduler/backend"
)

// Classify reads back each message this package makes for a failed call.
func TestClassifyReadsTheMessagesOfThisPackage(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		want ModelFailure
	}{
		{msgCancelled, ModelFailure{Kind: FailCancelled}},
		{msgQueuePurged, ModelFailure{Kind: FailCancelled}},
		{msgExpired(30), ModelFailure{Kind: FailExpired}},
		{msgInferenceTimeout(300), ModelFailure{Kind: FailTimeout}},
		{msgStoppedForTimeout(300), ModelFailure{Kind: FailTimeout}},
		{msgFailedToStart("process exited with status 1"), ModelFailure{Kind: FailNotStarted}},
		{msgNeedsGPUs(&needsGPUsError{need: 2, have: 1}), ModelFailure{Kind: FailNotStarted}},
		{msgInterrupted, ModelFailure{Kind: FailRestart}},
		{inferFailure(&backend.HTTPError{Status: 400, Body: `{"error":{"message":"x"}}`}, false, nil),
			ModelFailure{Kind: FailModelHTTP, Status: 400, Body: `{"error":{"message":"x"}}`}},
		{inferFailure(&backend.HTTPError{Status: 503}, false, nil), ModelFailure{Kind: FailModelHTTP, Status: 503}},
		{inferFailure(errors.New("connection reset"), false, nil), ModelFailure{Kind: FailOther}},
		{msgExited(nil), ModelFailure{Kind: FailOther}},
	} {
		if got := Classify(tc.msg); got != tc.want {
			t.Errorf("Classify(%q) = %+v, want %+v", tc.msg, got, tc.want)
		}
	}
}
