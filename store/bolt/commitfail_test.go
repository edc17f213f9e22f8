package bolt

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"testing"

	"golang.org/x/sys/unix"

	"inferd/store"
)

// TestAFailedCommitIsTheCallersErrorAndStoresNothing makes the file a
// commit writes refuse writes (its descriptor swapped for a read-only one
// of the same file, as a disk gone read-only after an I/O error would): the
// write-ahead log for a call write, the data file for the others. Each must
// return an error to its caller, and nothing of it may be stored, as a
// caller told of a failure must be able to trust. Once the file takes writes
// again, so does the store.
func TestAFailedCommitIsTheCallersErrorAndStoresNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "inferd.db")
	s := openAt(t, path, Options{})
	if _, err := s.PutProject(testProject("kept", "acme")); err != nil {
		t.Fatal(err)
	}
	// A first call write makes the log segment the next one appends to.
	first := store.Call{ID: newCallID(), ProjectID: "kept", TeamID: "acme", State: store.CallQueued}
	if err := s.SaveCall(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	logs, err := WALFiles(path)
	if err != nil || len(logs) != 1 {
		t.Fatalf("log segments: %v, %v", logs, err)
	}
	callID := newCallID()
	var secret string
	for _, tc := range []struct {
		op     string
		file   string // the file whose writes fail
		commit func() error
	}{
		{"SaveCall", logs[0], func() error {
			return s.SaveCall(context.Background(), store.Call{ID: callID, ProjectID: "kept", TeamID: "acme",
				State: store.CallQueued, Inputs: json.RawMessage(`{"n":1}`)})
		}},
		{"PutProject", path, func() error { _, err := s.PutProject(testProject("lost", "acme")); return err }},
		{"CreateScopedKey", path, func() (err error) {
			secret, _, err = s.CreateScopedKey("acme", store.ScopeTeam, store.KeyLimits{})
			return err
		}},
		{"SetTeamQuota", path, func() error { _, err := s.SetTeamQuota("acme", store.Quota{Replicas: 7}); return err }},
	} {
		restore := refuseWrites(t, tc.file)
		err := tc.commit()
		restore()
		if err == nil {
			t.Errorf("%s returned no error though its commit could not be written", tc.op)
		}
	}

	// Nothing of them is stored, read back from the file itself.
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	s = openAt(t, path, Options{})
	if _, err := s.GetCall(callID); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the call whose commit failed is stored: %v", err)
	}
	if _, err := s.GetCall(first.ID); err != nil {
		t.Errorf("the call committed before: %v", err)
	}
	if _, err := s.GetProject("lost"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the project whose commit failed is stored: %v", err)
	}
	if secret != "" {
		if _, err := s.Authenticate(secret); err == nil {
			t.Error("the key whose commit failed authenticates")
		}
	}
	if team, err := s.GetTeam("acme"); err != nil || team.Quota.Replicas == 7 {
		t.Errorf("team acme = %+v, %v; want it without the quota whose commit failed", team, err)
	}
	if _, err := s.PutProject(testProject("later", "acme")); err != nil {
		t.Errorf("a commit once the file takes writes again: %v", err)
	}
}

// refuseWrites puts a read-only descriptor of the file at path (the data
// file, or a log segment) in the place of this process's read-write one
// (bbolt writes pages with pwrite through it, its reads go through the
// memory map; the log appends with pwrite), and returns the function that
// puts the read-write one back.
func refuseWrites(t *testing.T, path string) (restore func()) {
	t.Helper()
	fd := dataFileFD(t, path)
	saved, err := unix.Dup(fd)
	if err != nil {
		t.Fatal(err)
	}
	ro, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(ro)
	if err := unix.Dup3(ro, fd, unix.O_CLOEXEC); err != nil {
		t.Fatal(err)
	}
	return func() {
		if err := unix.Dup3(saved, fd, unix.O_CLOEXEC); err != nil {
			t.Fatal(err)
		}
		unix.Close(saved)
	}
}
