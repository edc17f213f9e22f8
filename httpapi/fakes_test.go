package httpapi

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"inferd/store"
)

// fakeStore is an in-memory Store and AdminStore.
type fakeStore struct {
	mu        sync.Mutex
	keys      map[string]store.APIKey // by secret
	projects  map[string]store.Project
	modelKeys map[string]string // modelKey → project id
	teams     map[string]store.Team
	nKeys     int
	authErr   error // returned by Authenticate when set
	authPanic bool
}

func newFakeStore() *fakeStore {
	return &fakeStore{
		keys:      map[string]store.APIKey{},
		projects:  map[string]store.Project{},
		modelKeys: map[string]string{},
		teams:     map[string]store.Team{},
	}
}

func (f *fakeStore) addKey(secret, team string, scope store.KeyScope, revoked bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.nKeys++
	k := store.APIKey{ID: fmt.Sprintf("k%d", f.nKeys), TeamID: team, Scope: scope, Hash: "hash-" + secret, Created: time.Unix(1700000000, 0).UTC()}
	if revoked {
		k.Revoked = time.Unix(1700000100, 0).UTC()
	}
	f.keys[secret] = k
	f.teams[team] = store.Team{ID: team, Created: k.Created}
}

func (f *fakeStore) addProject(p store.Project, modelKey string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.projects[p.ID] = p
	f.modelKeys[modelKey] = p.ID
	f.teams[p.TeamID] = store.Team{ID: p.TeamID}
}

func (f *fakeStore) project(id string) store.Project {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.projects[id]
}

func (f *fakeStore) Authenticate(secret string) (store.APIKey, error) {
	if f.authPanic {
		panic("authenticate exploded")
	}
	if f.authErr != nil {
		return store.APIKey{}, f.authErr
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	k, ok := f.keys[secret]
	if !ok || k.IsRevoked() {
		return store.APIKey{}, store.ErrInvalidKey
	}
	return k, nil
}

func (f *fakeStore) ProjectByModelKey(modelKey string) (store.Project, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	id, ok := f.modelKeys[modelKey]
	if !ok {
		return store.Project{}, store.ErrNotFound
	}
	return f.projects[id], nil
}

func (f *fakeStore) GetProject(id string) (store.Project, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.projects[id]
	if !ok {
		return store.Project{}, fmt.Errorf("project %s: %w", id, store.ErrNotFound)
	}
	return p, nil
}

// ListProjects returns the projects in map order: the handlers must sort.
func (f *fakeStore) ListProjects(teamID string) ([]store.Project, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.Project
	for _, p := range f.projects {
		if teamID == "" || p.TeamID == teamID {
			out = append(out, p)
		}
	}
	return out, nil
}

func (f *fakeStore) UpdateProject(id string, fn func(*store.Project) error) (store.Project, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p, ok := f.projects[id]
	if !ok {
		return store.Project{}, fmt.Errorf("project %s: %w", id, store.ErrNotFound)
	}
	if err := fn(&p); err != nil {
		return store.Project{}, err
	}
	f.projects[id] = p
	return p, nil
}

func (f *fakeStore) ListTeams() ([]store.Team, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ids := slices.Sorted(maps.Keys(f.teams))
	out := make([]store.Team, len(ids))
	for i, id := range ids {
		out[i] = f.teams[id]
	}
	return out, nil
}

func (f *fakeStore) CreateKey(teamID string, scope store.KeyScope) (string, store.APIKey, error) {
	secret := fmt.Sprintf("ik_new%d_secret", len(f.keys)+1)
	f.addKey(secret, teamID, scope, false)
	f.mu.Lock()
	defer f.mu.Unlock()
	return secret, f.keys[secret], nil
}

func (f *fakeStore) ListKeys(teamID string) ([]store.APIKey, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []store.APIKey
	for _, k := range f.keys {
		if teamID == "" || k.TeamID == teamID {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b store.APIKey) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

func (f *fakeStore) RevokeKey(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for s, k := range f.keys {
		if k.ID == id {
			if !k.IsRevoked() {
				k.Revoked = time.Unix(1700000200, 0).UTC()
			}
			f.keys[s] = k
			return nil
		}
	}
	return store.ErrNotFound
}

// PutProjects is all or nothing, as the store's is: every conflict is
// checked before anything is written.
func (f *fakeStore) PutProjects(ps []store.Project) ([]store.Change, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range ps {
		for _, q := range f.projects {
			if q.ID != p.ID && q.Model.KeyHash == p.Model.KeyHash {
				return nil, fmt.Errorf("put project %s: modelKey already belongs to project %s: %w", p.ID, q.ID, store.ErrConflict)
			}
		}
	}
	changes := make([]store.Change, len(ps))
	for i, p := range ps {
		if _, ok := f.teams[p.TeamID]; !ok {
			f.teams[p.TeamID] = store.Team{ID: p.TeamID}
		}
		old, ok := f.projects[p.ID]
		f.projects[p.ID] = p
		switch {
		case !ok:
			changes[i] = store.ChangeCreated
		case reflect.DeepEqual(old, p):
			changes[i] = store.ChangeUnchanged
		default:
			changes[i] = store.ChangeUpdated
		}
	}
	return changes, nil
}

func (f *fakeStore) DeleteProject(id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.projects[id]; !ok {
		return store.ErrNotFound
	}
	delete(f.projects, id)
	return nil
}

// fakeCall is a call with its completion signal.
type fakeCall struct {
	call store.Call
	done chan struct{}
}

// fakeScheduler keeps calls in memory; tests finish them by hand, which
// closes the call's done channel exactly as the scheduler does.
type fakeScheduler struct {
	mu        sync.Mutex
	calls     map[string]*fakeCall
	n         int
	submitErr error
	// instant makes Submit finish each call at once with outputs {"ok":true}
	// (the call is still reported queued by Submit, like the real one).
	instant   bool
	submitCtx context.Context
	lookups   chan string // receives the id of every Lookup, when not full
	notReady  bool
}

func newFakeScheduler() *fakeScheduler {
	return &fakeScheduler{calls: map[string]*fakeCall{}, lookups: make(chan string, 64)}
}

func (f *fakeScheduler) Submit(ctx context.Context, p store.Project, inputs json.RawMessage) (store.Call, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.submitCtx = ctx
	if f.submitErr != nil {
		return store.Call{}, f.submitErr
	}
	f.n++
	c := store.Call{
		ID: fmt.Sprintf("call_%d", f.n), ProjectID: p.ID, TeamID: p.TeamID,
		State: store.CallQueued, Inputs: inputs, Created: time.Now(),
	}
	fc := &fakeCall{call: c, done: make(chan struct{})}
	f.calls[c.ID] = fc
	if f.instant {
		fc.call.State = store.CallSucceeded
		fc.call.Outputs = json.RawMessage(`{"ok":true}`)
		fc.call.Message = "success"
		close(fc.done)
	}
	return c, nil
}

// SubmitWait is Submit, then a wait like the real one's: until the call is
// done, wait passes or ctx ends.
func (f *fakeScheduler) SubmitWait(ctx context.Context, p store.Project, inputs json.RawMessage, wait time.Duration) (store.Call, error) {
	c, err := f.Submit(context.WithoutCancel(ctx), p, inputs)
	if err != nil {
		return c, err
	}
	f.mu.Lock()
	done := f.calls[c.ID].done
	f.mu.Unlock()
	select {
	case f.lookups <- c.ID: // holding done, as after a Lookup (see waitLookup)
	default:
	}
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	case <-ctx.Done():
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[c.ID].call, nil
}

func (f *fakeScheduler) Lookup(id string) (store.Call, <-chan struct{}, error) {
	f.mu.Lock()
	fc, ok := f.calls[id]
	var c store.Call
	var done chan struct{}
	if ok {
		c, done = fc.call, fc.done
	}
	f.mu.Unlock()
	select {
	case f.lookups <- id:
	default:
	}
	if !ok {
		return store.Call{}, nil, fmt.Errorf("call %s: %w", id, store.ErrNotFound)
	}
	return c, done, nil
}

func (f *fakeScheduler) Ready() bool { return !f.notReady }

// add stores a call as given (its done channel closed if it is final).
func (f *fakeScheduler) add(c store.Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc := &fakeCall{call: c, done: make(chan struct{})}
	if c.State.Done() {
		close(fc.done)
	}
	f.calls[c.ID] = fc
}

// finish ends a call and wakes its waiters.
func (f *fakeScheduler) finish(id string, state store.CallState, outputs, message string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc := f.calls[id]
	fc.call.State = state
	fc.call.Message = message
	if outputs != "" {
		fc.call.Outputs = json.RawMessage(outputs)
	}
	fc.call.Dispatched = fc.call.Created.Add(time.Millisecond)
	fc.call.QueueMs, fc.call.RunMs = 1, 7
	close(fc.done)
}
