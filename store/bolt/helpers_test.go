package bolt

import (
	"path/filepath"
	"testing"

	"github.com/google/uuid"

	"inferd/store/storetest"
)

func testPath(t testing.TB) string {
	return filepath.Join(t.TempDir(), "inferd.db")
}

// openAt opens a store at path and closes it when the test ends.
func openAt(t testing.TB, path string, opts Options) *Store {
	t.Helper()
	s, err := Open(path, opts)
	if err != nil {
		t.Fatalf("Open(%s): %v", path, err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

func openTest(t testing.TB) *Store {
	t.Helper()
	return openAt(t, testPath(t), Options{})
}

// testProject is the contract suite's valid project, modelKey "key-"+id.
var testProject = storetest.Project

// newCallID returns a fresh call id shaped like the scheduler's: "call_" +
// a UUIDv7, so ids sort in creation order.
func newCallID() string { return "call_" + uuid.Must(uuid.NewV7()).String() }
