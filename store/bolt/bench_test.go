package bolt

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// BenchmarkSaveCallParallel measures durable call writes from many
// goroutines sharing group commits (each SaveCall waits for its fsync).
func BenchmarkSaveCallParallel(b *testing.B) {
	s := openTest(b)
	inputs := json.RawMessage(`{"prompt":"a short prompt for the model"}`)
	saveParallel(b, s, 16, func() store.Call { // 16 × GOMAXPROCS concurrent requests
		return store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued, Inputs: inputs}
	})
}

// BenchmarkSaveFinalCallParallel is the write of a synchronous start: one
// final write per call (record, finished and expiry index entries), from
// many goroutines sharing group commits. bytes/call is the file's growth.
func BenchmarkSaveFinalCallParallel(b *testing.B) { saveFinalParallel(b, nil) }

// BenchmarkSaveFinalCallWithUsageParallel is BenchmarkSaveFinalCallParallel
// with each call's usage in its record, which the same transaction adds to
// its hour's roll-up (usage.go): what the usage ledger costs a call.
func BenchmarkSaveFinalCallWithUsageParallel(b *testing.B) {
	cpu := 0.25
	saveFinalParallel(b, &store.CallUsage{ReplicaSeconds: 0.3, CPUSeconds: &cpu, PeakMemoryBytes: 1 << 28, BytesIn: 18, BytesOut: 11})
}

func saveFinalParallel(b *testing.B, usage *store.CallUsage) {
	s := openTest(b)
	inputs := json.RawMessage(`{"prompt":"hello"}`)
	outputs := json.RawMessage(`{"ok":true}`)
	before := fileSize(b, s)
	commits := saveParallel(b, s, 32, func() store.Call { // 32 × GOMAXPROCS, like c=64
		now := time.Now()
		return store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Inputs: inputs,
			Outputs: outputs, Created: now, Dispatched: now, Finished: now, ReplicaID: "r-1", Attempt: 1, Usage: usage}
	})
	b.ReportMetric(float64(fileSize(b, s)-before)/float64(b.N), "bytes/call")
	b.ReportMetric(float64(pageWrites(s))/float64(commits), "pagewrites/commit")
}

// saveParallel saves b.N calls made by newCall from parallelism ×
// GOMAXPROCS goroutines, reports writes per commit and returns the number
// of commits (at least 1).
func saveParallel(b *testing.B, s *Store, parallelism int, newCall func() store.Call) int64 {
	b.ReportAllocs()
	b.SetParallelism(parallelism)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := s.SaveCall(context.Background(), newCall()); err != nil {
				b.Error(err)
				return
			}
		}
	})
	b.StopTimer()
	st := s.CommitStats()
	commits := max(st.Commits, 1)
	b.ReportMetric(float64(st.Writes)/float64(commits), "writes/commit")
	return commits
}

// fileSize is the data's extent in the file (bbolt's high-water mark; the
// file itself grows in large steps).
func fileSize(b *testing.B, s *Store) int64 {
	var n int64
	if err := s.db.View(func(tx *bbolt.Tx) error { n = tx.Size(); return nil }); err != nil {
		b.Fatal(err)
	}
	return n
}

// BenchmarkSaveCallSerial is one writer waiting for each commit: the
// latency floor of a durable write (two fdatasyncs).
func BenchmarkSaveCallSerial(b *testing.B) {
	s := openTest(b)
	b.ReportAllocs()
	for b.Loop() {
		if err := s.SaveCall(context.Background(), store.Call{ID: newCallID(), State: store.CallQueued}); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAuthenticate(b *testing.B) {
	s := openTest(b)
	secret, _, err := s.CreateKey("acme", store.ScopeTeam)
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

// pageWrites is how many page writes bbolt has made since Open.
func pageWrites(s *Store) int64 {
	st := s.db.Stats()
	return st.TxStats.GetWrite()
}
