package store

import (
	"maps"
	"testing"
)

// TestReapplyMergesFieldByField: fields the manifest changed, added or
// dropped come from it; fields it left as they were keep the stored value,
// inside nested objects too.
func TestReapplyMergesFieldByField(t *testing.T) {
	first := NewProject("p", "t")
	first.Model.Command = []string{"python3", "server.py"}
	first.Model.KeyHash = HashModelKey("k")
	first.Model.Env = map[string]string{"A": "1", "B": "2"}
	first.Retries = 2
	stored := first.Declared()
	stored.IdleTimeout = 600 // set through the project API
	stored.Retries = 3       // set through the project API, later dropped from the manifest

	next := first.Clone()
	next.Model.Env = map[string]string{"A": "1", "B": "changed", "C": "new"}
	next.Retries = 0 // the manifest no longer sets it
	got, err := Reapply(stored, next.Declared())
	if err != nil {
		t.Fatal(err)
	}
	if got.IdleTimeout != 600 {
		t.Errorf("idleTimeout = %d, want the project API's 600 kept", got.IdleTimeout)
	}
	if got.Retries != 0 {
		t.Errorf("retries = %d, want 0: the manifest dropped it", got.Retries)
	}
	if want := map[string]string{"A": "1", "B": "changed", "C": "new"}; !maps.Equal(got.Model.Env, want) {
		t.Errorf("env = %v, want %v", got.Model.Env, want)
	}
	if got.LastApplied == nil || got.LastApplied.IdleTimeout != DefaultIdleTimeout || got.LastApplied.LastApplied != nil {
		t.Errorf("lastApplied = %+v, want the new declaration", got.LastApplied)
	}

	// Without a declaration on either side, the apply takes p whole.
	plain := stored
	plain.LastApplied = nil
	if got, _ := Reapply(plain, next.Declared()); got.IdleTimeout != DefaultIdleTimeout {
		t.Errorf("over a project without a declaration: idleTimeout %d, want the manifest's %d", got.IdleTimeout, DefaultIdleTimeout)
	}
}

// A re-apply of the same manifest after `project restart` keeps the restart
// count, so it does not roll the replicas once more (nor back).
func TestReapplyKeepsTheRestartCount(t *testing.T) {
	decl := NewProject("p", "t")
	decl.Model.Command = []string{"python3", "server.py"}
	decl.Model.KeyHash = HashModelKey("k")
	decl.Model.Revision = "dir:abc"
	stored := decl.Declared()
	stored.Model.Restarts = 2
	got, err := Reapply(stored, decl.Declared())
	if err != nil {
		t.Fatal(err)
	}
	if got.Model.Restarts != 2 || stored.Model.RestartNeeded(got.Model) {
		t.Errorf("restarts = %d after a re-apply, want 2 and no roll", got.Model.Restarts)
	}
}
