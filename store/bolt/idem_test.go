package bolt

import (
	"context"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// TestExpireCallsDropsIdempotencyIndexEntries: the index of a call started
// with an idempotency key goes with the call, so the file stays bounded;
// an entry that another call has taken over stays.
func TestExpireCallsDropsIdempotencyIndexEntries(t *testing.T) {
	s := openTest(t)
	ctx := context.Background()
	t0 := time.Unix(1700000000, 0).UTC()
	old := store.Call{ID: "call_a", TeamID: "acme", State: store.CallFailed, Message: "error: x",
		Created: t0, Finished: t0, IdempotencyKey: "k"}
	kept := store.Call{ID: "call_b", TeamID: "acme", State: store.CallSucceeded, Message: "success",
		Created: t0, Finished: t0.Add(time.Hour), IdempotencyKey: "other"}
	for _, c := range []store.Call{old, kept} {
		if err := s.SaveCall(ctx, c); err != nil {
			t.Fatal(err)
		}
	}
	if n, err := s.ExpireCalls(t0.Add(time.Minute)); err != nil || n != 1 {
		t.Fatalf("ExpireCalls = %d, %v; want 1", n, err)
	}
	count := func(bucket []byte) int {
		n := 0
		if err := s.view(func(tx *bbolt.Tx) error { n = tx.Bucket(bucket).Stats().KeyN; return nil }); err != nil {
			t.Fatal(err)
		}
		return n
	}
	if idem, of := count(bucketCallIdem), count(bucketCallIdemOf); idem != 1 || of != 1 {
		t.Errorf("index entries after expiry: callidem %d, callidemof %d; want only the kept call's", idem, of)
	}
	if got, err := s.CallByIdempotencyKey("acme", "other"); err != nil || got.ID != kept.ID {
		t.Errorf("kept call by its key = %+v, %v", got, err)
	}
}
