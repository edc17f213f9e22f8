// Package memstore is a store.Store in memory, for tests: the one stand-in
// for store/bolt that the httpapi and scheduler tests use, held to the same
// contract suite (store/storetest). Nothing survives the process; Reopen
// stands for a daemon restart.
//
// Call writes go through one writer goroutine in queue order, as bolt's
// group-commit writer does, so a test sees the same ordering and the same
// "done runs after the commit" timing. Tests can hold a write back
// (HoldCallWrites, ReleaseCallWrite), make writes fail (FailCallWrites) and
// read back every write applied (CallHistory).
package memstore

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"inferd/store"
)

// Options configure New. The zero value is ready to use.
type Options struct {
	// Now stamps Created, Updated, Revoked and a final call's missing
	// Finished. Nil means time.Now.
	Now func() time.Time
}

// Store is a store.Store in memory. Its methods are safe for concurrent use.
type Store struct {
	now func() time.Time

	mu      sync.Mutex
	d       *data // what has been committed
	closed  bool
	pending []callWrite // queued for the writer, in order
	hold    func(store.Call) bool
	fail    func(store.Call) error

	hooks store.ProjectHooks
	store.TeamHooks
	deliveryHooks store.DeliveryHooks

	kick     chan struct{} // a write was queued (buffered: one wake-up is enough)
	release  chan struct{} // ReleaseCallWrite hands a held write through
	quit     chan struct{} // closed by Close
	finished chan struct{} // closed when the writer has returned
	once     sync.Once
}

var _ store.Store = (*Store)(nil)

// data is the committed state. Records are kept as copies no caller holds.
type data struct {
	teams    map[string]store.Team
	keys     map[string]store.APIKey // by key id
	projects map[string]store.Project
	calls    map[string]store.Call
	idem     map[string]string         // store.IdempotencyIndexKey → call id
	history  []store.Call              // every call write applied, in order
	outbox   map[string]store.Delivery // pending deliveries, by id
	ended    map[string]time.Time      // ended deliveries' ids, with when they ended
	secrets  map[string]string         // webhook secrets, by team
	usage    map[store.UsageKey]store.UsageRow
}

type callWrite struct {
	c          store.Call
	done       func(error)
	deliveries []store.Delivery // webhook deliveries the write makes due
}

// New returns an empty store. Close ends its writer goroutine.
func New(opts Options) *Store {
	return open(&data{
		teams:    map[string]store.Team{},
		keys:     map[string]store.APIKey{},
		projects: map[string]store.Project{},
		calls:    map[string]store.Call{},
		outbox:   map[string]store.Delivery{},
		ended:    map[string]time.Time{},
		secrets:  map[string]string{},
		idem:     map[string]string{},
		usage:    map[store.UsageKey]store.UsageRow{},
	}, opts.Now)
}

func open(d *data, now func() time.Time) *Store {
	if now == nil {
		now = time.Now
	}
	s := &Store{
		now:      now,
		d:        d,
		kick:     make(chan struct{}, 1),
		release:  make(chan struct{}),
		quit:     make(chan struct{}),
		finished: make(chan struct{}),
	}
	go s.writer()
	return s
}

// Reopen closes s and returns a new store over what s committed, as a
// daemon restart finds its data file: writes that s failed or never applied
// are not there. Hooks, holds and failures are not carried over.
func (s *Store) Reopen() *Store {
	_ = s.Close()
	s.mu.Lock()
	defer s.mu.Unlock()
	return open(s.d, s.now)
}

// Close stops the writer once the writes queued before it are applied; a
// write held back (HoldCallWrites) and everything queued behind it fail with
// store.ErrClosed. Later calls of any method return store.ErrClosed.
func (s *Store) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		s.mu.Unlock()
		close(s.quit)
		<-s.finished
	})
	return nil
}

// HoldCallWrites makes the writer stop before applying each call write for
// which hold returns true, until ReleaseCallWrite lets it through: a test
// can then look at what callers do while a write is not yet durable. Writes
// queued behind a held one wait too, as they would behind a slow commit. Nil
// holds nothing.
func (s *Store) HoldCallWrites(hold func(store.Call) bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.hold = hold
}

// ReleaseCallWrite lets one held call write be applied. It blocks until the
// writer has taken it (so call it only when a write is held, or will be),
// or until the store is closed.
func (s *Store) ReleaseCallWrite() {
	select {
	case s.release <- struct{}{}:
	case <-s.quit:
	}
}

// FailCallWrites makes the writer fail each call write for which fail
// returns an error, with that error, instead of applying it (a full disk,
// say). Nil fails nothing.
func (s *Store) FailCallWrites(fail func(store.Call) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fail = fail
}

// CallHistory returns every write of call id applied since the store was
// first created (across Reopen), in order.
func (s *Store) CallHistory(id string) []store.Call {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []store.Call
	for _, c := range s.d.history {
		if c.ID == id {
			out = append(out, cloneCall(c))
		}
	}
	return out
}

// CallWrites returns how many call writes have been applied in all.
func (s *Store) CallWrites() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.d.history)
}

// writer applies queued call writes one by one, in order, and reports each
// to its done after applying it: the stand-in for bolt's group commit.
func (s *Store) writer() {
	defer close(s.finished)
	for {
		s.mu.Lock()
		if len(s.pending) == 0 {
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return
			}
			select {
			case <-s.kick:
			case <-s.quit:
			}
			continue
		}
		w := s.pending[0]
		s.pending = s.pending[1:]
		hold, fail := s.hold, s.fail
		s.mu.Unlock()
		if hold != nil && hold(w.c) {
			select {
			case <-s.release:
			case <-s.quit:
				s.failPending(w)
				return
			}
		}
		var err error
		if fail != nil {
			err = fail(w.c)
		}
		if err == nil {
			s.mu.Lock()
			c := w.c
			old, had := s.d.calls[c.ID]
			if len(c.Inputs) == 0 {
				c.Inputs = old.Inputs // a write without inputs keeps them
			}
			if row, ok := store.CallUsageRow(c); ok && !(had && old.State.Done()) {
				s.addUsage(row)
			}
			s.d.calls[c.ID] = c
			if w.c.IdempotencyKey != "" {
				s.d.idem[string(store.IdempotencyIndexKey(w.c.TeamID, w.c.IdempotencyKey))] = w.c.ID
			}
			s.d.history = append(s.d.history, w.c)
			queued := s.queueDeliveries(w.deliveries)
			s.mu.Unlock()
			s.deliveryHooks.Notify(queued)
		} else {
			err = fmt.Errorf("save calls: %w", err)
		}
		w.done(err)
	}
}

// failPending fails w and every write queued after it: the store closed
// while w was held back.
func (s *Store) failPending(w callWrite) {
	s.mu.Lock()
	rest := s.pending
	s.pending = nil
	s.mu.Unlock()
	w.done(fmt.Errorf("save call %s: %w", w.c.ID, store.ErrClosed))
	for _, w := range rest {
		w.done(fmt.Errorf("save call %s: %w", w.c.ID, store.ErrClosed))
	}
}

// SaveCall implements store.Calls.
func (s *Store) SaveCall(ctx context.Context, c store.Call) error {
	return store.SaveCallAndWait(ctx, s, c)
}

// SaveCallAsync implements store.Calls.
func (s *Store) SaveCallAsync(c store.Call, done func(error)) {
	c, done, ok := store.PrepareCallWrite(cloneCall(c), done, s.now)
	if !ok {
		return
	}
	if err := s.lock(fmt.Sprintf("save call %s", c.ID)); err != nil {
		done(err)
		return
	}
	s.pending = append(s.pending, callWrite{c: c, done: done, deliveries: store.DeliveriesFor(c, s.now().UTC())})
	s.mu.Unlock()
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// GetCall implements store.Calls.
func (s *Store) GetCall(id string) (store.Call, error) {
	if err := s.lock(fmt.Sprintf("get call %s", id)); err != nil {
		return store.Call{}, err
	}
	defer s.mu.Unlock()
	return lookup(s.d.calls, id, "get call", cloneCall)
}

// GetCallResult implements store.Calls.
func (s *Store) GetCallResult(id string) (store.Call, error) {
	if err := s.lock(fmt.Sprintf("get call result %s", id)); err != nil {
		return store.Call{}, err
	}
	defer s.mu.Unlock()
	return lookup(s.d.calls, id, "get call result", func(c store.Call) store.Call {
		return withoutInputs(cloneCall(c))
	})
}

// CallInputs implements store.Calls.
func (s *Store) CallInputs(id string) (json.RawMessage, error) {
	if err := s.lock(fmt.Sprintf("call inputs %s", id)); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	c, err := lookup(s.d.calls, id, "call inputs", cloneCall)
	return c.Inputs, err
}

// withoutInputs leaves c's inputs out, saying their size, as GetCallResult
// and PendingCalls do.
func withoutInputs(c store.Call) store.Call {
	c.InputBytes, c.Inputs = int64(len(c.Inputs)), nil
	return c
}

// CallByIdempotencyKey implements store.Calls.
func (s *Store) CallByIdempotencyKey(teamID, key string) (store.Call, error) {
	if err := s.lock("call by idempotency key"); err != nil {
		return store.Call{}, err
	}
	defer s.mu.Unlock()
	id, ok := s.d.idem[string(store.IdempotencyIndexKey(teamID, key))]
	if !ok {
		return store.Call{}, fmt.Errorf("call by idempotency key: %w", store.ErrNotFound)
	}
	return lookup(s.d.calls, id, "call by idempotency key", func(c store.Call) store.Call {
		return withoutInputs(cloneCall(c))
	})
}

// PendingCalls implements store.Calls.
func (s *Store) PendingCalls() ([]store.Call, error) {
	calls, err := s.selectCalls(func(c store.Call) bool { return !c.State.Done() }, false, -1, "pending calls")
	for i := range calls {
		calls[i] = withoutInputs(calls[i])
		calls[i].Outputs = nil
	}
	return calls, err
}

// RecentCalls implements store.Calls.
func (s *Store) RecentCalls(teamID string, limit int) ([]store.Call, error) {
	if limit <= 0 {
		return []store.Call{}, nil
	}
	calls, err := s.selectCalls(func(c store.Call) bool { return teamID == "" || c.TeamID == teamID }, true, limit, "recent calls")
	for i := range calls {
		calls[i].Inputs, calls[i].Outputs, calls[i].Webhook = nil, nil, ""
	}
	return calls, err
}

// selectCalls returns up to limit (-1: all) committed calls that keep
// accepts, by id (creation order for UUIDv7 ids), newest first if newest.
func (s *Store) selectCalls(keep func(store.Call) bool, newest bool, limit int, what string) ([]store.Call, error) {
	if err := s.lock(what); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	ids := slices.Sorted(maps.Keys(s.d.calls))
	if newest {
		slices.Reverse(ids)
	}
	out := []store.Call{}
	for _, id := range ids {
		if limit >= 0 && len(out) == limit {
			break
		}
		if c := s.d.calls[id]; keep(c) {
			out = append(out, cloneCall(c))
		}
	}
	return out, nil
}

// ExpireCalls implements store.Calls.
func (s *Store) ExpireCalls(finishedBefore time.Time) (int, error) {
	if err := s.lock("expire calls"); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	for id, c := range s.d.calls {
		if c.State.Done() && c.Finished.Before(finishedBefore) {
			delete(s.d.calls, id)
			if k := string(store.IdempotencyIndexKey(c.TeamID, c.IdempotencyKey)); c.IdempotencyKey != "" && s.d.idem[k] == id {
				delete(s.d.idem, k)
			}
			n++
		}
	}
	for id, t := range s.d.ended {
		if t.Before(finishedBefore) {
			delete(s.d.ended, id)
		}
	}
	return n, nil
}

// lookup returns a copy of m[id], or store.ErrNotFound. Callers hold mu.
func lookup[T any](m map[string]T, id, what string, clone func(T) T) (T, error) {
	v, ok := m[id]
	if !ok {
		var zero T
		return zero, fmt.Errorf("%s %s: %w", what, id, store.ErrNotFound)
	}
	return clone(v), nil
}

func cloneCall(c store.Call) store.Call {
	if c.Usage != nil {
		u := *c.Usage
		c.Usage = &u
	}
	c.WebhookEvents = slices.Clone(c.WebhookEvents)
	c.Inputs = slices.Clone(c.Inputs)
	c.Outputs = slices.Clone(c.Outputs)
	return c
}

// lock takes mu, or fails with store.ErrClosed after Close (what names the
// operation), not holding it then.
func (s *Store) lock(what string) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return fmt.Errorf("%s: %w", what, store.ErrClosed)
	}
	return nil
}

// EnsureTeam implements store.Teams.
func (s *Store) EnsureTeam(id string) (bool, error) {
	if err := store.ValidateTeamID(id); err != nil {
		return false, err
	}
	if err := s.lock(fmt.Sprintf("ensure team %s", id)); err != nil {
		return false, err
	}
	defer s.mu.Unlock()
	return s.ensureTeam(id), nil
}

// ensureTeam creates team id if missing. Callers hold mu.
func (s *Store) ensureTeam(id string) bool {
	if _, ok := s.d.teams[id]; ok {
		return false
	}
	s.d.teams[id] = store.Team{ID: id, Created: s.now().UTC()}
	return true
}

// ListTeams implements store.Teams.
func (s *Store) ListTeams() ([]store.Team, error) {
	if err := s.lock("list teams"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []store.Team
	for _, id := range slices.Sorted(maps.Keys(s.d.teams)) {
		out = append(out, s.d.teams[id])
	}
	return out, nil
}

// GetTeam implements store.Teams.
func (s *Store) GetTeam(id string) (store.Team, error) {
	if err := s.lock(fmt.Sprintf("get team %s", id)); err != nil {
		return store.Team{}, err
	}
	defer s.mu.Unlock()
	t, ok := s.d.teams[id]
	if !ok {
		return store.Team{}, fmt.Errorf("get team %s: %w", id, store.ErrNotFound)
	}
	return t, nil
}

// SetTeamQuota implements store.Teams.
func (s *Store) SetTeamQuota(id string, q store.Quota) (store.Team, error) {
	if err := store.ValidateTeamQuota(id, q); err != nil {
		return store.Team{}, err
	}
	if err := s.lock(fmt.Sprintf("set quota of team %s", id)); err != nil {
		return store.Team{}, err
	}
	s.ensureTeam(id)
	t := s.d.teams[id]
	changed := t.Quota != q
	t.Quota = q
	s.d.teams[id] = t
	s.mu.Unlock()
	if changed {
		s.NotifyTeam(id)
	}
	return t, nil
}

// CreateKey implements store.Keys.
func (s *Store) CreateKey(teamID string, scope store.KeyScope) (string, store.APIKey, error) {
	return s.CreateScopedKey(teamID, scope, store.KeyLimits{})
}

// CreateScopedKey implements store.Keys.
func (s *Store) CreateScopedKey(teamID string, scope store.KeyScope, lim store.KeyLimits) (string, store.APIKey, error) {
	secret, k, err := store.NewKey(teamID, scope, lim, s.now())
	if err != nil {
		return "", store.APIKey{}, err
	}
	if err := s.lock(fmt.Sprintf("create key for team %s", teamID)); err != nil {
		return "", store.APIKey{}, err
	}
	defer s.mu.Unlock()
	for {
		if _, taken := s.d.keys[k.ID]; !taken {
			break
		}
		secret, k, _ = store.NewKey(teamID, scope, lim, s.now())
	}
	s.ensureTeam(teamID)
	s.d.keys[k.ID] = k
	return secret, k, nil
}

// AddKey stores a key for secret as given (its ID must be the one the
// secret embeds, see store.KeyIDOf), creating its team: for tests that need
// fixed, readable secrets. Hash and Created are filled in when empty.
func (s *Store) AddKey(secret string, k store.APIKey) error {
	id, ok := store.KeyIDOf(secret)
	if !ok || k.ID != "" && k.ID != id {
		return fmt.Errorf("add key: secret %q is not shaped like an API key with id %q", secret, k.ID)
	}
	if err := store.ValidateTeamID(k.TeamID); err != nil {
		return err
	}
	k.ID = id
	if k.Hash == "" {
		k.Hash = store.HashKeySecret(secret)
	}
	if k.Created.IsZero() {
		k.Created = s.now().UTC()
	}
	if err := s.lock(fmt.Sprintf("add key %s", id)); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.ensureTeam(k.TeamID)
	s.d.keys[id] = k
	return nil
}

// ListKeys implements store.Keys.
func (s *Store) ListKeys(teamID string) ([]store.APIKey, error) {
	if err := s.lock("list keys"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []store.APIKey
	for _, k := range s.d.keys {
		if teamID == "" || k.TeamID == teamID {
			out = append(out, k)
		}
	}
	slices.SortFunc(out, func(a, b store.APIKey) int {
		return cmp.Or(cmp.Compare(a.TeamID, b.TeamID), a.Created.Compare(b.Created), cmp.Compare(a.ID, b.ID))
	})
	return out, nil
}

// RevokeKey implements store.Keys.
func (s *Store) RevokeKey(id string) error {
	if err := s.lock(fmt.Sprintf("revoke key %s", id)); err != nil {
		return err
	}
	defer s.mu.Unlock()
	k, ok := s.d.keys[id]
	if !ok {
		return fmt.Errorf("revoke key %s: %w", id, store.ErrNotFound)
	}
	if !k.IsRevoked() {
		k.Revoked = s.now().UTC()
		s.d.keys[id] = k
	}
	return nil
}

// Authenticate implements store.Keys.
func (s *Store) Authenticate(secret string) (store.APIKey, error) {
	id, ok := store.KeyIDOf(secret)
	if !ok {
		return store.APIKey{}, store.ErrInvalidKey
	}
	if err := s.lock(fmt.Sprintf("authenticate key %s", id)); err != nil {
		return store.APIKey{}, err
	}
	defer s.mu.Unlock()
	k, ok := s.d.keys[id]
	if !ok || k.IsRevoked() || !k.Matches(secret) {
		return store.APIKey{}, store.ErrInvalidKey
	}
	return k, nil
}

// PutProject implements store.Projects.
func (s *Store) PutProject(p store.Project) (store.Change, error) {
	return store.PutOne(s, p)
}

// PutProjects implements store.Projects: every project is checked (and a
// manifest's declaration merged with the stored project: store.Reapply)
// before any is written, so a failure leaves the store as it was.
func (s *Store) PutProjects(ps []store.Project) ([]store.Change, error) {
	if err := store.ValidateAll(ps); err != nil {
		return nil, err
	}
	if err := s.lock("put projects"); err != nil {
		return nil, err
	}
	ps = slices.Clone(ps)
	for i, p := range ps {
		old, exists := s.d.projects[p.ID]
		if !exists {
			continue
		}
		var err error
		if ps[i], err = store.Reapply(old, p); err != nil {
			s.mu.Unlock()
			return nil, err
		}
	}
	// The modelKey owners after the whole write, checked first.
	owners := map[string]string{}
	for _, p := range s.d.projects {
		owners[p.Model.KeyHash] = p.ID
	}
	for _, p := range ps {
		if old, ok := s.d.projects[p.ID]; ok && owners[old.Model.KeyHash] == p.ID {
			delete(owners, old.Model.KeyHash)
		}
		if owner, ok := owners[p.Model.KeyHash]; ok && owner != p.ID {
			s.mu.Unlock()
			return nil, fmt.Errorf("put project %s: modelKey already belongs to project %s: %w", p.ID, owner, store.ErrConflict)
		}
		owners[p.Model.KeyHash] = p.ID
	}
	changes := make([]store.Change, len(ps))
	for i, p := range ps {
		old, exists := s.d.projects[p.ID]
		if !exists {
			changes[i] = store.ChangeCreated
			s.saveProject(nil, p)
			continue
		}
		var write bool
		if changes[i], write = store.PutChange(old, p); write {
			s.saveProject(&old, p)
		}
	}
	s.mu.Unlock()
	for i, p := range ps {
		if changes[i] != store.ChangeUnchanged {
			s.hooks.Notify(p.ID)
		}
	}
	return changes, nil
}

// saveProject stores a copy of p, replacing old (nil when p is new), with
// its stamps and team, and returns it as stored. Callers hold mu and
// checked p.
func (s *Store) saveProject(old *store.Project, p store.Project) store.Project {
	s.ensureTeam(p.TeamID)
	now := s.now().UTC()
	p.Created, p.Updated = now, now
	if old != nil {
		p.Created = old.Created
	}
	p = p.Clone()
	s.d.projects[p.ID] = p
	return p.Clone()
}

// UpdateProject implements store.Projects.
func (s *Store) UpdateProject(id string, fn func(*store.Project) error) (store.Project, error) {
	if err := s.lock(fmt.Sprintf("update project %s", id)); err != nil {
		return store.Project{}, err
	}
	old, ok := s.d.projects[id]
	if !ok {
		s.mu.Unlock()
		return store.Project{}, fmt.Errorf("update project %s: %w", id, store.ErrNotFound)
	}
	p, err := store.Edit(old, fn)
	if err != nil {
		s.mu.Unlock()
		return store.Project{}, err
	}
	if store.SameContent(old, p) {
		s.mu.Unlock()
		return old.Clone(), nil
	}
	for _, q := range s.d.projects {
		if q.ID != id && q.Model.KeyHash == p.Model.KeyHash {
			s.mu.Unlock()
			return store.Project{}, fmt.Errorf("update project %s: modelKey already belongs to project %s: %w", id, q.ID, store.ErrConflict)
		}
	}
	p = s.saveProject(&old, p)
	s.mu.Unlock()
	s.hooks.Notify(id)
	return p, nil
}

// GetProject implements store.Projects.
func (s *Store) GetProject(id string) (store.Project, error) {
	if err := s.lock(fmt.Sprintf("get project %s", id)); err != nil {
		return store.Project{}, err
	}
	defer s.mu.Unlock()
	return lookup(s.d.projects, id, "get project", store.Project.Clone)
}

// ProjectByModelKey implements store.Projects.
func (s *Store) ProjectByModelKey(modelKey string) (store.Project, error) {
	hash := store.HashModelKey(modelKey)
	if err := s.lock("project by modelKey"); err != nil {
		return store.Project{}, err
	}
	defer s.mu.Unlock()
	for _, p := range s.d.projects {
		if p.Model.KeyHash == hash {
			return p.Clone(), nil
		}
	}
	return store.Project{}, fmt.Errorf("project by modelKey: %w", store.ErrNotFound)
}

// ListProjects implements store.Projects.
func (s *Store) ListProjects(teamID string) ([]store.Project, error) {
	if err := s.lock("list projects"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	var out []store.Project
	for _, id := range slices.Sorted(maps.Keys(s.d.projects)) {
		if p := s.d.projects[id]; teamID == "" || p.TeamID == teamID {
			out = append(out, p.Clone())
		}
	}
	return out, nil
}

// DeleteProject implements store.Projects.
func (s *Store) DeleteProject(id string) error {
	if err := s.lock(fmt.Sprintf("delete project %s", id)); err != nil {
		return err
	}
	if _, ok := s.d.projects[id]; !ok {
		s.mu.Unlock()
		return fmt.Errorf("delete project %s: %w", id, store.ErrNotFound)
	}
	delete(s.d.projects, id)
	s.mu.Unlock()
	s.hooks.Notify(id)
	return nil
}

// OnProjectChange implements store.Projects.
func (s *Store) OnProjectChange(fn func(projectID string)) { s.hooks.OnProjectChange(fn) }

// queueDeliveries puts into the outbox those of ds it holds no record of,
// and returns them. Callers hold mu.
func (s *Store) queueDeliveries(ds []store.Delivery) []store.Delivery {
	var queued []store.Delivery
	for _, d := range ds {
		_, pending := s.d.outbox[d.ID]
		_, ended := s.d.ended[d.ID]
		if !pending && !ended {
			s.d.outbox[d.ID] = d
			queued = append(queued, d)
		}
	}
	return queued
}

// PendingDeliveries implements store.Outbox.
func (s *Store) PendingDeliveries() ([]store.Delivery, error) {
	if err := s.lock("pending deliveries"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := []store.Delivery{}
	for _, id := range slices.Sorted(maps.Keys(s.d.outbox)) {
		out = append(out, s.d.outbox[id])
	}
	return out, nil
}

// UpdateDelivery implements store.Outbox.
func (s *Store) UpdateDelivery(d store.Delivery) error {
	what := fmt.Sprintf("update delivery %s", d.ID)
	if err := s.lock(what); err != nil {
		return err
	}
	defer s.mu.Unlock()
	if _, ok := s.d.outbox[d.ID]; !ok {
		return fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	if d.Ended.IsZero() {
		s.d.outbox[d.ID] = d
		return nil
	}
	delete(s.d.outbox, d.ID)
	s.d.ended[d.ID] = d.Ended
	return nil
}

// OnDeliveryQueued implements store.Outbox.
func (s *Store) OnDeliveryQueued(fn func(store.Delivery)) { s.deliveryHooks.OnDeliveryQueued(fn) }

// WebhookSecret implements store.Outbox.
func (s *Store) WebhookSecret(teamID string, rotate bool) (string, error) {
	if err := store.ValidateTeamID(teamID); err != nil {
		return "", err
	}
	what := fmt.Sprintf("webhook secret of team %s", teamID)
	if err := s.lock(what); err != nil {
		return "", err
	}
	defer s.mu.Unlock()
	if _, ok := s.d.teams[teamID]; !ok {
		return "", fmt.Errorf("%s: %w", what, store.ErrNotFound)
	}
	if sec := s.d.secrets[teamID]; sec != "" && !rotate {
		return sec, nil
	}
	sec := store.NewWebhookSecret()
	s.d.secrets[teamID] = sec
	return sec, nil
}

// AddUsage implements store.Usage.
func (s *Store) AddUsage(rows []store.UsageRow) error {
	for _, r := range rows {
		if err := r.Validate(); err != nil {
			return err
		}
	}
	if err := s.lock("add usage"); err != nil {
		return err
	}
	defer s.mu.Unlock()
	for _, r := range rows {
		s.addUsage(r)
	}
	return nil
}

// addUsage adds r to its hour's row. Callers hold mu.
func (s *Store) addUsage(r store.UsageRow) {
	k := r.Key()
	sum, ok := s.d.usage[k]
	if !ok {
		sum = store.UsageRow{Hour: k.Hour, TeamID: k.TeamID, ProjectID: k.ProjectID}
	}
	sum.Add(r)
	s.d.usage[k] = sum
}

// UsageRows implements store.Usage.
func (s *Store) UsageRows(teamID string, from, to time.Time) ([]store.UsageRow, error) {
	if err := s.lock("usage rows"); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	out := []store.UsageRow{}
	for k, r := range s.d.usage {
		if (teamID == "" || k.TeamID == teamID) && !k.Hour.Before(from) && k.Hour.Before(to) {
			out = append(out, r)
		}
	}
	return store.SumUsage(out), nil
}

// ExpireUsage implements store.Usage.
func (s *Store) ExpireUsage(before time.Time) (int, error) {
	if err := s.lock("expire usage"); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	n := 0
	for k := range s.d.usage {
		if k.Hour.Before(before) {
			delete(s.d.usage, k)
			n++
		}
	}
	return n, nil
}
