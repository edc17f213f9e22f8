package pipeline

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync"
	"testing"
	"time"

	"inferd/scheduler"
	"inferd/store"
)

// fakeStore knows keys by secret and projects by id.
type fakeStore struct {
	mu       sync.Mutex
	keys     map[string]store.APIKey
	projects map[string]store.Project
	lists    int      // ListProjects calls
	during   func()   // runs inside ListProjects, once
	err      error    // every read fails with it
	reads    []string // what was read, in order
}

func (s *fakeStore) Authenticate(secret string) (store.APIKey, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads = append(s.reads, "key")
	k, ok := s.keys[secret]
	if !ok {
		return store.APIKey{}, store.ErrInvalidKey
	}
	return k, nil
}

func (s *fakeStore) project(match func(store.Project) bool) (store.Project, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reads = append(s.reads, "project")
	if s.err != nil {
		return store.Project{}, s.err
	}
	for _, p := range s.projects {
		if match(p) {
			return p, nil
		}
	}
	return store.Project{}, store.ErrNotFound
}

func (s *fakeStore) ProjectByModelKey(mk string) (store.Project, error) {
	return s.project(func(p store.Project) bool { return mk == "mk-"+p.ID })
}

func (s *fakeStore) GetProject(id string) (store.Project, error) {
	return s.project(func(p store.Project) bool { return p.ID == id })
}

func (s *fakeStore) ListProjects(team string) ([]store.Project, error) {
	s.mu.Lock()
	s.lists++
	during := s.during
	s.during = nil
	var out []store.Project
	for _, p := range s.projects {
		if team == "" || p.TeamID == team {
			out = append(out, p)
		}
	}
	s.mu.Unlock()
	if during != nil {
		during()
	}
	slices.SortFunc(out, func(a, b store.Project) int { return cmpString(a.ID, b.ID) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// fakeSched starts calls as call_N, each queued until finish.
type fakeSched struct {
	mu     sync.Mutex
	n      int
	calls  map[string]store.Call
	done   map[string]chan struct{}
	err    error // Start's refusal
	starts []scheduler.Request
	ctxs   []context.Context
}

func (f *fakeSched) Start(ctx context.Context, p store.Project, req scheduler.Request) (store.Call, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts = append(f.starts, req)
	f.ctxs = append(f.ctxs, ctx)
	if f.err != nil {
		return store.Call{}, f.err
	}
	f.n++
	c := store.Call{ID: fmt.Sprintf("call_%d", f.n), ProjectID: p.ID, TeamID: p.TeamID, State: store.CallQueued, Route: req.Route}
	if f.calls == nil {
		f.calls, f.done = map[string]store.Call{}, map[string]chan struct{}{}
	}
	f.calls[c.ID], f.done[c.ID] = c, make(chan struct{})
	return c, nil
}

func (f *fakeSched) Lookup(id string) (store.Call, <-chan struct{}, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c, ok := f.calls[id]
	if !ok {
		return store.Call{}, nil, store.ErrNotFound
	}
	return c, f.done[id], nil
}

func (f *fakeSched) finish(id string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := f.calls[id]
	c.State = store.CallSucceeded
	f.calls[id] = c
	close(f.done[id])
}

func project(id, team string, protocol string, aliases ...string) store.Project {
	p := store.Project{ID: id, TeamID: team}
	p.Model.Protocol = protocol
	p.Model.Aliases = aliases
	return p
}

type env struct {
	st    *fakeStore
	sched *fakeSched
	p     *Pipeline
}

func newEnv(t *testing.T, cfg Config) env {
	t.Helper()
	st := &fakeStore{
		keys: map[string]store.APIKey{
			"acme":     {ID: "k1", TeamID: "acme", Scope: store.ScopeTeam},
			"admin":    {ID: "k0", Scope: store.ScopeAdmin},
			"revoked":  {ID: "k2", TeamID: "acme", Scope: store.ScopeTeam, Revoked: time.Unix(1, 0)},
			"expired":  {ID: "k3", TeamID: "acme", Scope: store.ScopeTeam, KeyLimits: store.KeyLimits{Expires: time.Unix(1, 0)}},
			"readonly": {ID: "k4", TeamID: "acme", Scope: store.ScopeTeam, KeyLimits: store.KeyLimits{Permissions: []store.Permission{store.PermRead}}},
			"only-b":   {ID: "k5", TeamID: "acme", Scope: store.ScopeTeam, KeyLimits: store.KeyLimits{Projects: []string{"b"}}},
		},
		projects: map[string]store.Project{
			"a":     project("a", "acme", store.ProtocolOpenAI, "shared"),
			"b":     project("b", "acme", store.ProtocolOpenAI, "shared", "bee"),
			"h":     project("h", "acme", store.ProtocolHTTP),
			"other": project("other", "globex", store.ProtocolOpenAI, "x"),
		},
	}
	sched := &fakeSched{}
	cfg.Store, cfg.Sched = st, sched
	return env{st: st, sched: sched, p: New(cfg)}
}

// Each way a request is refused before a call exists, and the project a
// request reaches, whichever way its door names it.
func TestResolveRefusesWhatAKeyMayNotDoAndFindsWhatItMay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		secret  string
		target  Target
		want    Kind // -100: admitted
		project string
	}{
		{"an unknown key", "nope", Target{ProjectID: "a"}, RefusedKey, ""},
		{"a revoked key", "revoked", Target{ProjectID: "a"}, RefusedKey, ""},
		{"an expired key", "expired", Target{ProjectID: "a"}, RefusedKeyExpired, ""},
		{"a key without infer", "readonly", Target{ProjectID: "a"}, RefusedScope, ""},
		{"an unknown project", "acme", Target{ProjectID: "zzz"}, RefusedProject, ""},
		{"another team's project", "acme", Target{ProjectID: "other"}, RefusedProject, ""},
		{"a project outside the allowlist", "only-b", Target{ProjectID: "a"}, RefusedProject, ""},
		{"another team's model name", "acme", Target{ModelName: "x"}, RefusedProject, ""},
		{"a project by id", "acme", Target{ProjectID: "a"}, -100, "a"},
		{"a project by modelKey", "acme", Target{ModelKey: "mk-b"}, -100, "b"},
		{"a model by id", "acme", Target{ModelName: "b"}, -100, "b"},
		{"a model by alias", "acme", Target{ModelName: "bee"}, -100, "b"},
		{"an alias two projects share: the first by id", "acme", Target{ModelName: "shared"}, -100, "a"},
		{"a shared alias within the allowlist", "only-b", Target{ModelName: "shared"}, -100, "b"},
		{"another team's model for an admin key", "admin", Target{ModelName: "x"}, -100, "other"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, Config{})
			out, ref := e.p.Start(context.Background(), Request{Secret: tc.secret, Target: tc.target})
			switch {
			case tc.want == -100 && ref != nil:
				t.Fatalf("refused: %v (kind %d)", ref, ref.Kind)
			case tc.want == -100 && out.Project.ID != tc.project:
				t.Fatalf("project %q, want %q", out.Project.ID, tc.project)
			case tc.want != -100 && (ref == nil || ref.Kind != tc.want):
				t.Fatalf("refusal %+v, want kind %d", ref, tc.want)
			case tc.want != -100 && len(e.sched.starts) > 0:
				t.Fatalf("a refused request started a call")
			}
		})
	}
}

// The model names of a team are read once, however many requests and
// projects there are, and again after a project changes; a list read
// across a change is not kept.
func TestModelNamesAreReadOncePerTeamUntilAProjectChanges(t *testing.T) {
	e := newEnv(t, Config{})
	start := func(model string) string {
		out, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ModelName: model}})
		if ref != nil {
			return "refused"
		}
		return out.Project.ID
	}
	for range 3 {
		if got := start("bee"); got != "b" {
			t.Fatalf("bee: %s", got)
		}
	}
	if e.st.lists != 1 {
		t.Fatalf("%d lists for three requests, want 1", e.st.lists)
	}
	// Each request gets a project of its own: one's change to it never
	// reaches the next.
	first, _ := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ModelName: "bee"}})
	first.Project.Model.Aliases[0] = "changed"
	if next, _ := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ModelName: "bee"}}); next.Project.Model.Aliases[0] != "shared" {
		t.Fatalf("a request's change reached the next: aliases %v", next.Project.Model.Aliases)
	}
	e.st.mu.Lock()
	e.st.projects["c"] = project("c", "acme", store.ProtocolOpenAI, "sea")
	e.st.mu.Unlock()
	e.p.ProjectChanged("c")
	if got := start("sea"); got != "c" {
		t.Fatalf("sea after the change: %s", got)
	}
	// A change while the list is read: that list may predate it.
	e.st.during = func() {
		e.st.mu.Lock()
		delete(e.st.projects, "c")
		e.st.mu.Unlock()
		e.p.ProjectChanged("c")
	}
	e.p.ProjectChanged("x")
	start("sea")
	if got := start("sea"); got != "refused" {
		t.Fatalf("sea after its project was deleted: %s", got)
	}
}

// The hooks run in order, the key's before its project is read; the first
// refusal ends admission, gives back what the hooks before it took, is
// counted under its hook's name and starts no call.
func TestAdmissionHooksRunInOrderAndCountTheirRefusals(t *testing.T) {
	var log []string
	hook := func(name string, refuse bool) Hook {
		return Hook{Name: name, Admit: func(a *Admission) (func(), error) {
			log = append(log, name)
			if refuse {
				return nil, errors.New(name + " says no")
			}
			return func() { log = append(log, "free "+name) }, nil
		}}
	}
	var heard []string
	for _, tc := range []struct {
		name      string
		key, call []Hook
		want      []string
		refusedBy string
		reads     []string
	}{
		{"all admit", []Hook{hook("rate", false)}, []Hook{hook("waits", false), hook("streams", false)},
			[]string{"rate", "free rate", "waits", "streams"}, "", []string{"key", "project"}},
		{"the key's hook refuses before the project is read", []Hook{hook("rate", true)}, []Hook{hook("waits", false)},
			[]string{"rate"}, "rate", []string{"key"}},
		{"a later hook refuses: the earlier gives back", nil, []Hook{hook("waits", false), hook("streams", true), hook("never", false)},
			[]string{"waits", "streams", "free waits"}, "streams", []string{"key", "project"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			log, heard = nil, nil
			e := newEnv(t, Config{KeyHooks: tc.key, CallHooks: tc.call, OnRefusal: func(h string, _ error) { heard = append(heard, h) }})
			out, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ProjectID: "a"}, Hold: HoldWait})
			if tc.refusedBy == "" {
				if ref != nil {
					t.Fatalf("refused: %v", ref)
				}
				out.Release()
				log = slices.DeleteFunc(log, func(s string) bool { return s == "free waits" || s == "free streams" })
			} else if ref == nil || ref.Kind != RefusedBudget || ref.Hook != tc.refusedBy || len(e.sched.starts) != 0 {
				t.Fatalf("refusal %+v (%d starts), want %s's", ref, len(e.sched.starts), tc.refusedBy)
			}
			if !slices.Equal(log, tc.want) {
				t.Errorf("hooks did %q, want %q", log, tc.want)
			}
			if !slices.Equal(e.st.reads, tc.reads) {
				t.Errorf("read %q, want %q", e.st.reads, tc.reads)
			}
			counts := map[string]uint64{}
			e.p.Refusals(func(h string, n uint64) { counts[h] = n })
			if tc.refusedBy != "" && (counts[tc.refusedBy] != 1 || !slices.Equal(heard, []string{tc.refusedBy})) {
				t.Errorf("refusals %v, heard %v", counts, heard)
			}
		})
	}
}

// A hook with no room for a wait that may degrade lets the request in
// holding nothing: its call is started without a wait.
func TestADegradedWaitStartsTheCallWithoutWaiting(t *testing.T) {
	full := Hook{Name: "waits", Admit: func(a *Admission) (func(), error) {
		if !a.MayDegrade {
			return nil, errors.New("full")
		}
		a.Hold = HoldNone
		return nil, nil
	}}
	e := newEnv(t, Config{CallHooks: []Hook{full}})
	out, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ProjectID: "a"},
		Hold: HoldWait, MayDegrade: true, Sync: true, Wait: func(store.Project) time.Duration { return time.Minute }})
	if ref != nil || out.Hold != HoldNone || e.sched.starts[0].Wait != 0 {
		t.Fatalf("outcome %+v, %v; started with wait %v", out, ref, e.sched.starts)
	}
	if _, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ProjectID: "a"}, Hold: HoldWait}); ref == nil {
		t.Fatal("a wait that may not degrade was let in")
	}
}

// A sync start waits inside Start under the client's context; any other
// start runs under one the client's leaving never cancels.
func TestOnlyASyncStartWaitsUnderTheClientsContext(t *testing.T) {
	e := newEnv(t, Config{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	minute := func(store.Project) time.Duration { return time.Minute }
	e.p.Start(ctx, Request{Secret: "acme", Target: Target{ProjectID: "a"}, Hold: HoldWait, Sync: true, Wait: minute})
	e.p.Start(ctx, Request{Secret: "acme", Target: Target{ProjectID: "a"}, Hold: HoldWait, Wait: minute})
	e.p.Start(ctx, Request{Secret: "acme", Target: Target{ProjectID: "a"}, Hold: HoldStream, Sync: true, Wait: minute})
	cancel()
	if e.sched.ctxs[0].Err() == nil || e.sched.ctxs[1].Err() != nil || e.sched.ctxs[2].Err() != nil {
		t.Errorf("context errors: sync %v, others %v, %v", e.sched.ctxs[0].Err(), e.sched.ctxs[1].Err(), e.sched.ctxs[2].Err())
	}
	if w := []time.Duration{e.sched.starts[0].Wait, e.sched.starts[1].Wait, e.sched.starts[2].Wait}; w[0] != time.Minute || w[1] != 0 || w[2] != 0 {
		t.Errorf("waits inside Start %v, want a minute for the sync start alone", w)
	}
}

type fakePlacer struct {
	remote Remote
	err    error
}

func (f fakePlacer) Place(*http.Request, store.Project) (Remote, error) { return f.remote, f.err }

type fakeRemote struct {
	ok    bool
	limit *time.Duration
}

func (f fakeRemote) Forward(w http.ResponseWriter, _ *http.Request, _ []byte, limit time.Duration) bool {
	*f.limit = limit
	if f.ok {
		w.WriteHeader(http.StatusTeapot)
	}
	return f.ok
}

// A call placed on another node is answered there: no local hook holds
// anything for it and no call starts here; a forward no node takes is
// RefusedUnavailable, or RefusedShuttingDown while inferd stops.
func TestACallPlacedElsewhereIsForwardedNotStarted(t *testing.T) {
	stopped := make(chan struct{})
	close(stopped)
	for _, tc := range []struct {
		name     string
		ok       bool
		stopping <-chan struct{}
		want     Kind // -100: forwarded
	}{
		{"taken", true, nil, -100},
		{"no node takes it", false, nil, RefusedUnavailable},
		{"no node takes it while stopping", false, stopped, RefusedShuttingDown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var limit time.Duration
			held := 0
			e := newEnv(t, Config{Place: fakePlacer{remote: fakeRemote{ok: tc.ok, limit: &limit}}, Stopping: tc.stopping,
				CallHooks: []Hook{{Name: "waits", Admit: func(*Admission) (func(), error) { held++; return nil, nil }}}})
			w := httptest.NewRecorder()
			out, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ProjectID: "a"}, Hold: HoldWait,
				W: w, R: httptest.NewRequest("POST", "/run/a/", nil), Wait: func(store.Project) time.Duration { return 7 * time.Second }})
			switch {
			case tc.want == -100 && (ref != nil || !out.Forwarded || w.Code != http.StatusTeapot):
				t.Fatalf("outcome %+v, %v", out, ref)
			case tc.want != -100 && (ref == nil || ref.Kind != tc.want):
				t.Fatalf("refusal %+v, want kind %d", ref, tc.want)
			}
			if limit != 7*time.Second || held != 0 || len(e.sched.starts) != 0 {
				t.Errorf("forward limit %v, %d hooks held, %d local starts", limit, held, len(e.sched.starts))
			}
		})
	}
	e := newEnv(t, Config{Place: fakePlacer{err: errors.New("signature")}})
	if _, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ProjectID: "a"}}); ref == nil || ref.Kind != RefusedPlace {
		t.Errorf("a placer's refusal: %+v", ref)
	}
}

// The scheduler's refusals are typed for the doors, and what the hooks
// took is given back.
func TestSchedulerRefusalsAreTyped(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want Kind
	}{
		{fmt.Errorf("queue full (3 calls waiting); retry later: %w", scheduler.ErrQueueFull), RefusedQueueFull},
		{fmt.Errorf("team quota: %w", scheduler.ErrTeamQuota), RefusedQueueFull},
		{fmt.Errorf("big: %w", scheduler.ErrNeedsGPUs), RefusedCannotRun},
		{scheduler.ErrIdempotencyMismatch, RefusedIdempotency},
		{fmt.Errorf("save: %w", store.ErrStorageFull), RefusedStorageFull},
		{fmt.Errorf("save: %w", store.ErrUnavailable), RefusedUnavailable},
		{fmt.Errorf("save: %w", store.ErrClosed), RefusedInternal},
		{errors.New("scheduler is stopping"), RefusedScheduler},
	} {
		freed := false
		e := newEnv(t, Config{CallHooks: []Hook{{Name: "waits", Admit: func(*Admission) (func(), error) { return func() { freed = true }, nil }}}})
		e.sched.err = tc.err
		_, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ProjectID: "a"}, Hold: HoldWait})
		if ref == nil || ref.Kind != tc.want || !errors.Is(ref, tc.err) || !freed {
			t.Errorf("%v: refusal %+v (freed %v), want kind %d", tc.err, ref, freed, tc.want)
		}
	}
}

// Await says why it stopped: the call finished, the wait ran out, the
// client left, inferd stops.
func TestAwaitSaysWhyItStopped(t *testing.T) {
	stopping := make(chan struct{})
	e := newEnv(t, Config{Stopping: stopping})
	started := func() store.Call {
		out, ref := e.p.Start(context.Background(), Request{Secret: "acme", Target: Target{ProjectID: "a"}})
		if ref != nil {
			t.Fatal(ref)
		}
		return out.Call
	}

	c := started()
	e.sched.finish(c.ID)
	if got, end, err := e.p.Await(context.Background(), c, nil, time.Hour); err != nil || end != Finished || got.State != store.CallSucceeded {
		t.Errorf("finished: %s %v %v", got.State, end, err)
	}

	c = started()
	_, done, _ := e.sched.Lookup(c.ID)
	go e.sched.finish(c.ID)
	if got, end, _ := e.p.Await(context.Background(), c, done, time.Hour); end != Finished || got.State != store.CallSucceeded {
		t.Errorf("woken: %s %v", got.State, end)
	}

	if got, end, _ := e.p.Await(context.Background(), started(), nil, time.Nanosecond); end != WaitOver || got.State != store.CallQueued {
		t.Errorf("a wait that ran out: %s %v", got.State, end)
	}

	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, end, _ := e.p.Await(ctx, started(), nil, time.Hour); end != ClientGone {
		t.Errorf("a client that left: %v", end)
	}

	close(stopping)
	if _, end, _ := e.p.Await(context.Background(), started(), nil, time.Hour); end != Stopping {
		t.Errorf("inferd stopping: %v", end)
	}

	if _, _, err := e.p.Await(context.Background(), store.Call{ID: "call_nope"}, nil, time.Hour); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("an unknown call: %v", err)
	}
}

// An operator's request (inferd call) has no key: it reaches any team's
// project by id, runs no admission hook (they are keys' budgets), and a
// missing project is refused as one.
func TestAnOperatorsRequestNeedsNoKeyAndRunsNoHooks(t *testing.T) {
	ran := 0
	refuse := Hook{Name: "rate", Admit: func(*Admission) (func(), error) { ran++; return nil, errors.New("no") }}
	e := newEnv(t, Config{KeyHooks: []Hook{refuse}, CallHooks: []Hook{refuse}})
	out, ref := e.p.Start(context.Background(), Request{Operator: true, Target: Target{ProjectID: "other"}})
	if ref != nil || out.Project.ID != "other" || out.Call.TeamID != "globex" || ran != 0 {
		t.Fatalf("outcome %+v, refusal %v, %d hooks ran", out, ref, ran)
	}
	for _, target := range []Target{{ProjectID: "nope"}, {ModelName: "a"}} {
		if _, ref := e.p.Start(context.Background(), Request{Operator: true, Target: target}); ref == nil || ref.Kind != RefusedProject {
			t.Errorf("target %+v: refusal %v, want RefusedProject", target, ref)
		}
	}
	if _, ref := e.p.Start(context.Background(), Request{Target: Target{ProjectID: "other"}}); ref == nil || ref.Kind != RefusedKey {
		t.Errorf("a request with no key that is not the operator's: refusal %v", ref)
	}
}
