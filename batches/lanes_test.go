package batches

import (
	"strings"
	"testing"
)

// All of a project's batches together keep at most half of its queue, in
// calls and in bytes, so that interactive calls always find room (issue
// 41: several batches filled the queue and interactive requests got 429
// queue_full); each batch still runs to its end.
func TestAProjectsBatchesTogetherKeepHalfItsQueue(t *testing.T) {
	for _, tc := range []struct {
		name          string
		queued        int
		queuedBytes   int64
		most          int // calls pending at once, at most
		mostBytes     int
		linesPerBatch int
	}{
		// The project's own window (2 replicas x 1 x 2) is 4; half of a
		// queue of 6 is 3.
		{name: "calls", queued: 6, queuedBytes: 1 << 30, most: 3, linesPerBatch: 10},
		// Half of 200 bytes is 100: two calls of 42 bytes.
		{name: "bytes", queued: 1000, queuedBytes: 200, most: 2, mostBytes: 100, linesPerBatch: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sched := newFakeSched()
			m := startManagerWith(t, Config{Dir: t.TempDir(), Sched: sched, Store: fakeStore{llm(), sched},
				MaxQueuedPerProject: tc.queued, MaxQueuedBytesPerProject: tc.queuedBytes})
			var ids []string
			for range 3 {
				f, _ := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(tc.linesPerBatch, chatLine)))
				b, err := m.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
				if err != nil {
					t.Fatal(err)
				}
				ids = append(ids, b.ID)
			}
			for sched.made() < 3*tc.linesPerBatch {
				waitPending(t, sched, min(tc.most, 3*tc.linesPerBatch-sched.made()))
				sched.answerAll(func(int) bool { return true })
			}
			for _, id := range ids {
				if b := waitStatus(t, m.Manager, "acme", id, StatusCompleted); b.RequestCounts.Completed != tc.linesPerBatch {
					t.Errorf("batch %s: %+v", id, b.RequestCounts)
				}
			}
			sched.mu.Lock()
			defer sched.mu.Unlock()
			if sched.mostPending > tc.most || tc.mostBytes > 0 && sched.mostPendingBytes > tc.mostBytes {
				t.Errorf("%d calls (%d bytes) pending at once, want at most %d (%d bytes)", sched.mostPending, sched.mostPendingBytes, tc.most, tc.mostBytes)
			}
		})
	}
}
