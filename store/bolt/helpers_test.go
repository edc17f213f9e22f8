package bolt

import (
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"

	"inferd/store"
)

// fakeClock is an injectable clock that moves only when told to.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{t: time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)}
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

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

// testProject returns a valid project whose modelKey is "key-"+id.
func testProject(id, team string) store.Project {
	p := store.NewProject(id, team)
	p.Model.Command = []string{"/usr/bin/model", "--port", "$PORT"}
	p.Model.KeyHash = store.HashModelKey("key-" + id)
	return p
}

// newCallID returns a fresh call id shaped like the scheduler's: "call_" +
// a UUIDv7, so ids sort in creation order.
func newCallID() string { return "call_" + uuid.Must(uuid.NewV7()).String() }
