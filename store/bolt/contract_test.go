package bolt

import (
	"testing"
	"time"

	"inferd/store"
	"inferd/store/storetest"
)

// TestContract runs the store contract suite against the bbolt file; a
// reopen is a new Open of the same path.
func TestContract(t *testing.T) {
	storetest.Run(t, func(t *testing.T, now func() time.Time) func() store.Store {
		path := testPath(t)
		return func() store.Store {
			s, err := Open(path, Options{Now: now})
			if err != nil {
				t.Fatalf("Open(%s): %v", path, err)
			}
			return s
		}
	})
}
