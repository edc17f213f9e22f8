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
