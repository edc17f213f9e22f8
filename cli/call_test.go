package cli

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/store"
	"inferd/store/bolt"
)

// With no daemon running, call cancel writes the cancel into the data file:
// the next daemon finds the call finished and never runs it.
func TestCallCancelWithoutDaemonCancelsStoredCall(t *testing.T) {
	r, dataDir := runInProcess(t, "key", "list") // creates the data file
	if r.code != 0 {
		t.Fatalf("key list: %d %s", r.code, r.stderr)
	}
	path := filepath.Join(dataDir, "inferd.db")
	st, err := bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	for _, c := range []store.Call{
		{ID: "call_q", ProjectID: "p", TeamID: "t", State: store.CallQueued, Created: now},
		{ID: "call_done", ProjectID: "p", TeamID: "t", State: store.CallSucceeded, Message: "success", Created: now},
	} {
		if err := st.SaveCall(context.Background(), c); err != nil {
			t.Fatal(err)
		}
	}
	st.Close()

	r = runCLI(t, nil, "--data-dir", dataDir, "call", "cancel", "call_q")
	if r.code != 0 || !strings.Contains(r.stdout, "Cancelled call call_q of project p.") {
		t.Fatalf("call cancel: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	// Cancelled once, it says so as a check of it does.
	r = runCLI(t, nil, "--data-dir", dataDir, "call", "cancel", "call_q")
	if r.code != 1 || !strings.Contains(r.stderr, "call already finished (failed: cancelled by request)") {
		t.Errorf("second cancel: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, nil, "--data-dir", dataDir, "call", "cancel", "call_done")
	if r.code != 1 || !strings.Contains(r.stderr, "call already finished (succeeded)") {
		t.Errorf("cancel of a finished call: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, nil, "--data-dir", dataDir, "call", "cancel", "call_nope")
	if r.code != 1 || !strings.Contains(r.stderr, "not found") {
		t.Errorf("cancel of an unknown call: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, nil, "--data-dir", dataDir, "call", "cancel")
	if r.code != 2 {
		t.Errorf("call cancel without an id: exit %d; want 2", r.code)
	}

	st, err = bolt.Open(path, bolt.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	c, err := st.GetCall("call_q")
	if err != nil || c.State != store.CallFailed || c.Message != "error: cancelled by request" {
		t.Errorf("stored call = %+v, %v; want it cancelled", c, err)
	}
}
