package bolt

import (
	"context"
	"strings"
	"testing"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

func TestCheckReportsCallsAndBrokenIndexes(t *testing.T) {
	path := testPath(t)
	s, err := Open(path, Options{})
	if err != nil {
		t.Fatal(err)
	}
	queued := store.Call{ID: newCallID(), ProjectID: "p", State: store.CallQueued}
	done := store.Call{ID: newCallID(), ProjectID: "p", State: store.CallSucceeded}
	for _, c := range []store.Call{queued, done} {
		if err := s.SaveCall(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}

	calls, problems, err := Check(path, time.Second)
	if err != nil || len(problems) != 0 {
		t.Fatalf("Check of a sound file = %v, %v", problems, err)
	}
	if len(calls) != 2 || calls[queued.ID].State != store.CallQueued || calls[done.ID].State != store.CallSucceeded {
		t.Fatalf("calls = %+v", calls)
	}

	// Drop the queued call from the pending index, as a torn write would.
	db, err := bbolt.Open(path, 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketCallPending).Delete([]byte(queued.ID))
	}); err != nil {
		t.Fatal(err)
	}
	if err := db.Close(); err != nil {
		t.Fatal(err)
	}
	_, problems, err = Check(path, time.Second)
	if err != nil || len(problems) != 1 || !strings.Contains(problems[0].Error(), queued.ID) {
		t.Errorf("Check after dropping a pending entry = %v, %v; want one problem naming %s", problems, err, queued.ID)
	}
}
