package etcd

import (
	"bytes"
	"testing"
	"time"

	"inferd/store"
)

// A call's writes committed in one batch keep the inputs of the one that
// carried them, though the batch sends only the last write of the call:
// the scheduler drops a queued call's inputs at once, so its next write
// (running) often joins the first in a commit.
func TestInputsSurviveALaterWriteInTheSameBatch(t *testing.T) {
	m := startMember(t, t.TempDir())
	s := openStore(t, m, Options{})
	defer s.Close()
	in := []byte(`{"prompt": "kept"}`)
	c := store.Call{ID: "call_1", TeamID: "acme", State: store.CallQueued, Inputs: in, Created: time.Now()}
	queued, err := s.newCallWrite(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	c.State, c.Inputs = store.CallRunning, nil
	running, err := s.newCallWrite(c, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.w.commit([]callWrite{queued, running}); err != nil {
		t.Fatal(err)
	}
	if got, err := s.CallInputs(c.ID); err != nil || !bytes.Equal(got, in) {
		t.Errorf("CallInputs = %q, %v; want %q", got, err, in)
	}
	if r, err := s.GetCallResult(c.ID); err != nil || r.State != store.CallRunning || r.InputBytes != int64(len(in)) {
		t.Errorf("GetCallResult = %s, InputBytes %d, %v; want running, %d", r.State, r.InputBytes, err, len(in))
	}
}
