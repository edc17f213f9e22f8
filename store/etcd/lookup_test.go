package etcd

import (
	"errors"
	"testing"

	"inferd/store"
	"inferd/store/storetest"
)

// A start's lookup in one transaction answers as Authenticate and then
// ProjectByModelKey would, on the node that did not write what it reads:
// after every write through the other node (a key revoked, a modelKey moved
// to another project, a project deleted), at once, the hint of the project
// a modelKey named last time notwithstanding.
func TestLookupStartAnswersAsTheSeparateReadsDo(t *testing.T) {
	n1, n2 := twoNodes(t)
	secret, k, err := n1.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	a := storetest.Project("a", "acme")
	a.Model.KeyHash = store.HashModelKey("mk")
	if _, err := n1.PutProject(a); err != nil {
		t.Fatal(err)
	}
	same := func(step, secret, modelKey, wantProject string, wantKeyErr, wantProjectErr error) {
		t.Helper()
		look := n2.LookupStart(secret, modelKey)
		key, keyErr := n2.Authenticate(secret)
		if !errors.Is(look.KeyErr, wantKeyErr) || !errors.Is(keyErr, wantKeyErr) || (keyErr == nil && look.Key.ID != key.ID) {
			t.Fatalf("%s: key %s, %v; Authenticate: %s, %v; want error %v", step, look.Key.ID, look.KeyErr, key.ID, keyErr, wantKeyErr)
		}
		if keyErr != nil {
			if look.Project.ID != "" || look.ProjectErr != nil {
				t.Errorf("%s: the project was read for a refused key: %q, %v", step, look.Project.ID, look.ProjectErr)
			}
			return
		}
		p, pErr := n2.ProjectByModelKey(modelKey)
		if look.Project.ID != wantProject || p.ID != wantProject || !errors.Is(look.ProjectErr, wantProjectErr) ||
			!errors.Is(pErr, wantProjectErr) || (pErr != nil && pErr.Error() != look.ProjectErr.Error()) {
			t.Fatalf("%s: project %q, %v; ProjectByModelKey: %q, %v; want %q, %v", step, look.Project.ID, look.ProjectErr, p.ID, pErr, wantProject, wantProjectErr)
		}
		if p.ID != "" && p.Model.KeyHash != look.Project.Model.KeyHash {
			t.Errorf("%s: project %+v, ProjectByModelKey's %+v", step, look.Project, p)
		}
	}
	same("first", secret, "mk", "a", nil, nil)
	same("warm", secret, "mk", "a", nil, nil)
	same("unknown modelKey", secret, "nobody", "", nil, store.ErrNotFound)
	same("malformed secret", "not-a-key", "mk", "", store.ErrInvalidKey, nil)

	// The modelKey moves from a to b: the hint names a, the index b.
	a.Model.KeyHash = store.HashModelKey("other")
	if _, err := n1.PutProject(a); err != nil {
		t.Fatal(err)
	}
	b := storetest.Project("b", "acme")
	b.Model.KeyHash = store.HashModelKey("mk")
	if _, err := n1.PutProject(b); err != nil {
		t.Fatal(err)
	}
	same("moved", secret, "mk", "b", nil, nil)
	same("moved, warm", secret, "mk", "b", nil, nil)

	if err := n1.DeleteProject("b"); err != nil {
		t.Fatal(err)
	}
	same("deleted", secret, "mk", "", nil, store.ErrNotFound)

	if err := n1.RevokeKey(k.ID); err != nil {
		t.Fatal(err)
	}
	same("revoked", secret, "other", "", store.ErrInvalidKey, nil)
}

// The key and project records a start reads are decoded once for the same
// bytes (decoded.go): a record changed through another node is read as
// changed, and each start gets a project of its own to change.
func TestLookupStartDecodesChangedRecordsAfreshAndHandsOutCopies(t *testing.T) {
	n1, n2 := twoNodes(t)
	secret, _, err := n1.CreateKey("acme", store.ScopeTeam)
	if err != nil {
		t.Fatal(err)
	}
	a := storetest.Project("a", "acme")
	a.Model.KeyHash = store.HashModelKey("mk")
	a.Model.Command = []string{"python3", "v1.py"}
	if _, err := n1.PutProject(a); err != nil {
		t.Fatal(err)
	}
	n2.LookupStart(secret, "mk") // the first reads the project by its id: the modelKey's hint is new
	first := n2.LookupStart(secret, "mk")
	if first.KeyErr != nil || first.ProjectErr != nil {
		t.Fatalf("lookup: %v, %v", first.KeyErr, first.ProjectErr)
	}
	first.Project.Model.Command[1] = "changed-by-its-caller.py"
	if again := n2.LookupStart(secret, "mk"); again.ProjectErr != nil || again.Project.Model.Command[1] != "v1.py" {
		t.Fatalf("second lookup: command %q, %v; want v1.py: a caller's change reached the next start",
			again.Project.Model.Command, again.ProjectErr)
	}

	a.Model.Command = []string{"python3", "v2.py"}
	if _, err := n1.PutProject(a); err != nil {
		t.Fatal(err)
	}
	if look := n2.LookupStart(secret, "mk"); look.ProjectErr != nil || look.Project.Model.Command[1] != "v2.py" {
		t.Fatalf("after the update through node 1: command %q, %v; want v2.py", look.Project.Model.Command, look.ProjectErr)
	}
}
