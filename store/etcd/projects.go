package etcd

import (
	"crypto/rand"
	"fmt"

	"inferd/store"
)

// PutProject implements store.Projects.
func (s *Store) PutProject(p store.Project) (store.Change, error) {
	return store.PutOne(s, p)
}

// PutProjects implements store.Projects: every project, its modelKey index
// entry and its team are written in one etcd transaction, or none is.
func (s *Store) PutProjects(ps []store.Project) ([]store.Change, error) {
	if err := store.ValidateAll(ps); err != nil {
		return nil, err
	}
	for {
		if err := s.check("put projects"); err != nil {
			return nil, err
		}
		v := newView(s, "put projects")
		changes := make([]store.Change, len(ps))
		for i, p := range ps {
			var err error
			if changes[i], err = s.putProject(v, p); err != nil {
				return nil, err
			}
		}
		ok, err := v.commit()
		if err != nil {
			return nil, err
		}
		if !ok {
			continue // another writer changed a project or index entry read
		}
		for i, p := range ps {
			if changes[i] != store.ChangeUnchanged {
				s.hooks.Notify(p.ID)
			}
		}
		return changes, nil
	}
}

// putProject plans the write of p in v, merged with the stored project
// when p is a manifest's declaration (store.Reapply).
func (s *Store) putProject(v *view, p store.Project) (store.Change, error) {
	old, exists, err := s.viewProject(v, p.ID)
	if err != nil {
		return "", err
	}
	if !exists {
		_, err := s.saveProject(v, nil, p)
		return store.ChangeCreated, err
	}
	if p, err = store.Reapply(old, p); err != nil {
		return "", err
	}
	change, write := store.PutChange(old, p)
	if write {
		_, err = s.saveProject(v, &old, p)
	}
	return change, err
}

// projectRecord is a project as a write through a view stores it: the
// project and a token drawn for that write. Two writes of the same project
// from the same read can compute the same record (one clock tick, one
// change): the token tells a view whose commit was sent again (its first
// answer lost: view.commit) its own applied write from another writer's,
// or it would take the other's for its own and its change would be lost.
// Readers decode a store.Project and ignore the token.
type projectRecord struct {
	store.Project
	Write string `json:"write"`
}

// saveProject plans p's write in v, replacing old (nil when p is new), with
// its stamps, its modelKey index entry and its team, and returns p as it
// will be stored. Callers validated p.
func (s *Store) saveProject(v *view, old *store.Project, p store.Project) (store.Project, error) {
	idx := s.key("modelkeys", p.Model.KeyHash)
	owner, taken, err := v.get(idx)
	if err != nil {
		return p, err
	}
	if taken && string(owner) != p.ID {
		return p, fmt.Errorf("put project %s: modelKey already belongs to project %s: %w", p.ID, owner, store.ErrConflict)
	}
	now := s.now().UTC()
	p.Created, p.Updated = now, now
	if old != nil {
		p.Created = old.Created
		if old.Model.KeyHash != p.Model.KeyHash {
			oldIdx := s.key("modelkeys", old.Model.KeyHash)
			if o, ok, err := v.get(oldIdx); err != nil {
				return p, err
			} else if ok && string(o) == p.ID {
				v.del(oldIdx)
			}
		}
	}
	val, err := encode("put project "+p.ID, projectRecord{Project: p, Write: rand.Text()})
	if err != nil {
		return p, err
	}
	v.put(s.key("projects", p.ID), val)
	v.put(idx, p.ID)
	v.teams[p.TeamID] = true
	return p, nil
}

// viewProject reads project id through v.
func (s *Store) viewProject(v *view, id string) (store.Project, bool, error) {
	k := s.key("projects", id)
	raw, ok, err := v.get(k)
	if err != nil || !ok {
		return store.Project{}, false, err
	}
	p, err := decode[store.Project](v.what, k, raw)
	return p, err == nil, err
}

// UpdateProject implements store.Projects: fn runs on the project as read,
// and the result is written only if nothing read has changed since;
// otherwise fn runs again on the newer project.
func (s *Store) UpdateProject(id string, fn func(*store.Project) error) (store.Project, error) {
	what := fmt.Sprintf("update project %s", id)
	for {
		if err := s.check(what); err != nil {
			return store.Project{}, err
		}
		v := newView(s, what)
		old, exists, err := s.viewProject(v, id)
		if err != nil {
			return store.Project{}, err
		}
		if !exists {
			return store.Project{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
		}
		p, err := store.Edit(old, fn)
		if err != nil {
			return store.Project{}, err
		}
		if store.SameContent(old, p) {
			return old, nil
		}
		if p, err = s.saveProject(v, &old, p); err != nil {
			return store.Project{}, fmt.Errorf("%s: %w", what, err)
		}
		ok, err := v.commit()
		if err != nil {
			return store.Project{}, err
		}
		if ok {
			s.hooks.Notify(id)
			return p, nil
		}
	}
}

// GetProject implements store.Projects.
func (s *Store) GetProject(id string) (store.Project, error) {
	return getRecord[store.Project](s, fmt.Sprintf("get project %s", id), s.key("projects", id))
}

// ProjectByModelKey implements store.Projects: two reads (the index, then
// the project), no cache, so every node sees each project write at once.
func (s *Store) ProjectByModelKey(modelKey string) (store.Project, error) {
	const what = "project by modelKey"
	if err := s.check(what); err != nil {
		return store.Project{}, err
	}
	id, _, ok, err := s.get(what, s.key("modelkeys", store.HashModelKey(modelKey)))
	if err != nil {
		return store.Project{}, err
	}
	if !ok {
		return store.Project{}, fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	p, err := s.GetProject(string(id))
	if err != nil {
		return store.Project{}, fmt.Errorf("%s: %w", what, err) // deleted meanwhile: ErrNotFound
	}
	return p, nil
}

// ListProjects implements store.Projects; keys sort by id.
func (s *Store) ListProjects(teamID string) ([]store.Project, error) {
	return list(s, "list projects", "projects", func(p store.Project) bool { return teamID == "" || p.TeamID == teamID })
}

// DeleteProject implements store.Projects: the project and its modelKey
// index entry go in one transaction.
func (s *Store) DeleteProject(id string) error {
	what := fmt.Sprintf("delete project %s", id)
	for {
		if err := s.check(what); err != nil {
			return err
		}
		v := newView(s, what)
		p, exists, err := s.viewProject(v, id)
		if err != nil {
			return err
		}
		if !exists {
			return fmt.Errorf("%s: %w", what, store.ErrNotFound)
		}
		v.del(s.key("projects", id))
		idx := s.key("modelkeys", p.Model.KeyHash)
		if owner, ok, err := v.get(idx); err != nil {
			return err
		} else if ok && string(owner) == id {
			v.del(idx)
		}
		ok, err := v.commit()
		if err != nil {
			return err
		}
		if ok {
			s.hooks.Notify(id)
			return nil
		}
	}
}

// OnProjectChange implements store.Projects. Hooks run for this store's
// own writes; another node's writes reach this node's scheduler through a
// watch, which is the next step (docs/cluster.md).
func (s *Store) OnProjectChange(fn func(projectID string)) { s.hooks.OnProjectChange(fn) }
