package bolt

import (
	"encoding/json"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// PutProject creates or replaces the project with p.ID (creating its team if
// missing) and reports which. Content equal to the stored project, ignoring
// Created and Updated, writes nothing and returns ChangeUnchanged. Created is
// kept from the stored project; both stamps from p are ignored. An invalid
// project returns its *ValidationError as is; a modelKey hash that belongs to
// another project fails with ErrConflict.
func (s *Store) PutProject(p store.Project) (store.Change, error) {
	return store.PutOne(s, p)
}

// PutProjects is PutProject for several projects in one transaction: either
// all are written or, on any error, none is (an apply never leaves a manifest
// half applied). Changes come back in the order of ps.
func (s *Store) PutProjects(ps []store.Project) ([]store.Change, error) {
	if err := store.ValidateAll(ps); err != nil {
		return nil, err
	}
	changes := make([]store.Change, len(ps))
	err := s.update(func(tx *bbolt.Tx) error {
		for i, p := range ps {
			change, err := s.putProject(tx, p)
			if err != nil {
				return fmt.Errorf("put project %s: %w", p.ID, err)
			}
			changes[i] = change
		}
		return nil
	})
	s.projects.reset()
	if err != nil {
		return nil, err
	}
	for i, p := range ps {
		if changes[i] != store.ChangeUnchanged {
			s.hooks.Notify(p.ID)
		}
	}
	return changes, nil
}

// putProject writes p inside tx (merged with the stored project when p is a
// manifest's declaration: store.Reapply) unless the stored project has the
// same content (store.PutChange), and reports which.
func (s *Store) putProject(tx *bbolt.Tx, p store.Project) (store.Change, error) {
	old, exists, err := getProject(tx, p.ID)
	if err != nil {
		return "", err
	}
	if !exists {
		_, err := s.saveProject(tx, nil, p)
		return store.ChangeCreated, err
	}
	if p, err = store.Reapply(old, p); err != nil {
		return "", err
	}
	change, write := store.PutChange(old, p)
	if write {
		_, err = s.saveProject(tx, &old, p)
	}
	return change, err
}

// UpdateProject loads the project, lets fn change it, validates and saves
// it, all in one write transaction: concurrent updates never lose each
// other's changes. An error from fn aborts and is returned as is (as is a
// *ValidationError), leaving the project unchanged. fn runs inside the
// transaction: it must be quick and must not call the Store. It may not
// change the id. A missing project fails with ErrNotFound.
func (s *Store) UpdateProject(id string, fn func(*store.Project) error) (store.Project, error) {
	var (
		p       store.Project
		changed bool
		abort   error // from fn or validation: returned unwrapped
	)
	err := s.update(func(tx *bbolt.Tx) error {
		old, exists, err := getProject(tx, id)
		if err != nil {
			return err
		}
		if !exists {
			return store.ErrNotFound
		}
		if p, abort = store.Edit(old, fn); abort != nil {
			return abort
		}
		if store.SameContent(old, p) {
			p = old
			return nil
		}
		changed = true
		p, err = s.saveProject(tx, &old, p)
		return err
	})
	s.projects.reset()
	if abort != nil {
		return store.Project{}, abort
	}
	if err != nil {
		return store.Project{}, fmt.Errorf("update project %s: %w", id, err)
	}
	if changed {
		s.hooks.Notify(id)
	}
	return p, nil
}

// saveProject writes p, replacing old (nil when p is new), keeps the
// modelkeys index and the team in step, and returns p as stored (with its
// stamps). Callers validated p.
func (s *Store) saveProject(tx *bbolt.Tx, old *store.Project, p store.Project) (store.Project, error) {
	idx := tx.Bucket(bucketModelKeys)
	if owner := idx.Get([]byte(p.Model.KeyHash)); owner != nil && string(owner) != p.ID {
		return p, fmt.Errorf("modelKey already belongs to project %s: %w", owner, store.ErrConflict)
	}
	if _, err := s.ensureTeam(tx, p.TeamID); err != nil {
		return p, err
	}
	now := s.now().UTC()
	p.Created, p.Updated = now, now
	if old != nil {
		p.Created = old.Created
		if old.Model.KeyHash != p.Model.KeyHash && string(idx.Get([]byte(old.Model.KeyHash))) == p.ID {
			if err := idx.Delete([]byte(old.Model.KeyHash)); err != nil {
				return p, err
			}
		}
	}
	v, err := json.Marshal(p)
	if err != nil {
		return p, fmt.Errorf("encode: %w", err)
	}
	if err := tx.Bucket(bucketProjects).Put([]byte(p.ID), v); err != nil {
		return p, err
	}
	return p, idx.Put([]byte(p.Model.KeyHash), []byte(p.ID))
}

func getProject(tx *bbolt.Tx, id string) (store.Project, bool, error) {
	v := tx.Bucket(bucketProjects).Get([]byte(id))
	if v == nil {
		return store.Project{}, false, nil
	}
	var p store.Project
	if err := json.Unmarshal(v, &p); err != nil {
		return store.Project{}, false, fmt.Errorf("decode project %s: %w", id, err)
	}
	return p, true, nil
}

// GetProject returns the project with the given id, or ErrNotFound.
func (s *Store) GetProject(id string) (store.Project, error) {
	var (
		p  store.Project
		ok bool
	)
	err := s.view(func(tx *bbolt.Tx) error {
		var err error
		p, ok, err = getProject(tx, id)
		return err
	})
	if err == nil && !ok {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Project{}, fmt.Errorf("get project %s: %w", id, err)
	}
	return p, nil
}

// ProjectByModelKey returns the project whose modelKey this is, or
// ErrNotFound. The modelKey itself is never stored or put in errors.
func (s *Store) ProjectByModelKey(modelKey string) (store.Project, error) {
	hash := store.HashModelKey(modelKey)
	p, gen, ok := s.projects.get(hash)
	if ok {
		return p, nil
	}
	err := s.view(func(tx *bbolt.Tx) error {
		id := tx.Bucket(bucketModelKeys).Get([]byte(hash))
		if id == nil {
			return nil
		}
		var err error
		p, ok, err = getProject(tx, string(id))
		return err
	})
	if err == nil && !ok {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Project{}, fmt.Errorf("project by modelKey: %w", err)
	}
	s.projects.put(hash, p, gen)
	return p, nil
}

// ListProjects returns the projects of a team, or of every team when teamID
// is "", sorted by id.
func (s *Store) ListProjects(teamID string) ([]store.Project, error) {
	var ps []store.Project
	err := s.view(func(tx *bbolt.Tx) error {
		return tx.Bucket(bucketProjects).ForEach(func(k, v []byte) error {
			var p store.Project
			if err := json.Unmarshal(v, &p); err != nil {
				return fmt.Errorf("decode project %s: %w", k, err)
			}
			if teamID == "" || p.TeamID == teamID {
				ps = append(ps, p)
			}
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("list projects: %w", err)
	}
	return ps, nil
}

// DeleteProject deletes the project and its modelKey index entry, or fails
// with ErrNotFound. Its calls stay until they expire.
func (s *Store) DeleteProject(id string) error {
	err := s.update(func(tx *bbolt.Tx) error {
		p, ok, err := getProject(tx, id)
		if err != nil {
			return err
		}
		if !ok {
			return store.ErrNotFound
		}
		idx := tx.Bucket(bucketModelKeys)
		if string(idx.Get([]byte(p.Model.KeyHash))) == id {
			if err := idx.Delete([]byte(p.Model.KeyHash)); err != nil {
				return err
			}
		}
		return tx.Bucket(bucketProjects).Delete([]byte(id))
	})
	s.projects.reset()
	if err != nil {
		return fmt.Errorf("delete project %s: %w", id, err)
	}
	s.hooks.Notify(id)
	return nil
}

// OnProjectChange registers fn to be called with a project's id after each
// committed create, update or delete of that project (see store.Projects).
func (s *Store) OnProjectChange(fn func(projectID string)) { s.hooks.OnProjectChange(fn) }
