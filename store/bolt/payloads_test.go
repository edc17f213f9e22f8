package bolt

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// TestPayloadsLiveOutsideTheRecordAndGoWithIt: a call's record holds no
// payload (a check decodes only it), its inputs and outputs are chunked in
// their buckets, and expiry leaves no chunk behind.
func TestPayloadsLiveOutsideTheRecordAndGoWithIt(t *testing.T) {
	s := openTest(t)
	big := bytes.Repeat([]byte("x"), 3*payloadChunk+5)
	in := json.RawMessage(`{"d":"` + string(big) + `"}`)
	c := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Inputs: in,
		Outputs: in, Message: "success", Finished: time.Now().Add(-time.Hour)}
	if err := s.SaveCall(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	count := func(tx *bbolt.Tx, name []byte) int { return tx.Bucket(name).Stats().KeyN }
	s.pend.flush() // into the data file, to look at its buckets
	err := s.view(func(tx *bbolt.Tx) error {
		if rec := tx.Bucket(bucketCalls).Get([]byte(c.ID)); len(rec) > 1024 || bytes.Contains(rec, []byte("xxxx")) {
			t.Errorf("the call record holds a payload: %d bytes", len(rec))
		}
		if n := count(tx, bucketCallInputs); n != 4 {
			t.Errorf("inputs in %d chunks, want 4", n)
		}
		if n := count(tx, bucketCallOutputs); n != 4 {
			t.Errorf("outputs in %d chunks, want 4", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	// A small payload stays in the record: no chunk, no read of its own.
	small := store.Call{ID: newCallID(), ProjectID: "p", TeamID: "t", State: store.CallQueued, Inputs: json.RawMessage(`{"prompt": "hi"}`)}
	if err := s.SaveCall(context.Background(), small); err != nil {
		t.Fatal(err)
	}
	s.pend.flush()
	err = s.view(func(tx *bbolt.Tx) error {
		if rec := tx.Bucket(bucketCalls).Get([]byte(small.ID)); !bytes.Contains(rec, []byte(`"inputs":{"prompt": "hi"}`)) {
			t.Errorf("small inputs are not in the record as written: %s", rec)
		}
		if n := count(tx, bucketCallInputs); n != 4 {
			t.Errorf("%d input chunks after a small call, want the big call's 4", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if n, err := s.ExpireCalls(time.Now()); err != nil || n != 1 {
		t.Fatalf("ExpireCalls = %d, %v", n, err)
	}
	err = s.view(func(tx *bbolt.Tx) error {
		if n := count(tx, bucketCallInputs) + count(tx, bucketCallOutputs); n != 0 {
			t.Errorf("%d payload chunks left after expiry", n)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
}
