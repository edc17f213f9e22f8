package store

import (
	"context"
	"encoding/json"
	"testing"
)

// BenchmarkSaveCallParallel measures durable call writes from many
// goroutines sharing group commits (each SaveCall waits for its fsync).
func BenchmarkSaveCallParallel(b *testing.B) {
	s := openTest(b)
	inputs := json.RawMessage(`{"prompt":"a short prompt for the model"}`)
	b.ReportAllocs()
	b.SetParallelism(16) // 16 × GOMAXPROCS concurrent requests
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			c := Call{ID: NewCallID(), ProjectID: "p", TeamID: "t", State: CallQueued, Inputs: inputs}
			if err := s.SaveCall(context.Background(), c); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	st := s.CommitStats()
	b.ReportMetric(float64(st.Writes)/float64(max(st.Commits, 1)), "writes/commit")
}

// BenchmarkSaveCallSerial is one writer waiting for each commit: the
// latency floor of a durable write (two fdatasyncs).
func BenchmarkSaveCallSerial(b *testing.B) {
	s := openTest(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.SaveCall(context.Background(), Call{ID: NewCallID(), State: CallQueued}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	s := openTest(b)
	secret, _, err := s.CreateKey("acme", ScopeTeam)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := s.Authenticate(secret); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
