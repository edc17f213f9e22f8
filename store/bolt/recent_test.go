package bolt

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

// BenchmarkRecentCallsLargeInputs is a status poll (the newest 500 calls)
// over finished calls with 100 KB inputs and outputs, as an image model's
// would be. Decoding them all on every poll took 0.53 s here; with the
// summary cache a later poll takes about 0.1 ms.
func BenchmarkRecentCallsLargeInputs(b *testing.B) {
	s := openTest(b)
	big := json.RawMessage(`{"image":"` + strings.Repeat("A", 100<<10) + `"}`)
	for range 500 {
		c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Inputs: big, Outputs: big,
			Message: "success", Created: time.Now(), Finished: time.Now()}
		if err := s.SaveCall(context.Background(), c); err != nil {
			b.Fatal(err)
		}
	}
	// The first poll decodes every record; the page's later polls are what
	// this measures.
	if _, err := s.RecentCalls("", 500); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if calls, err := s.RecentCalls("", 500); err != nil || len(calls) != 500 {
			b.Fatalf("RecentCalls = %d calls, %v", len(calls), err)
		}
	}
}
