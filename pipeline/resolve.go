package pipeline

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"inferd/store"
)

// Store is what the pipeline reads: keys and projects.
type Store interface {
	Authenticate(secret string) (store.APIKey, error)
	ProjectByModelKey(modelKey string) (store.Project, error)
	GetProject(id string) (store.Project, error)
	ListProjects(teamID string) ([]store.Project, error)
}

// Target is how a door names the project of a call: exactly one field is
// set.
type Target struct {
	ModelKey  string // the Banana API's modelKey
	ProjectID string // /run/PROJECT
	ModelName string // an OpenAI request's model: a project id, then an alias
}

// Caller is a resolved request: the key that makes it and the project it
// calls, which the key may reach.
type Caller struct {
	Key     store.APIKey
	Project store.Project
}

// resolve authenticates secret, runs the key's hooks on a (its Key set
// here; its FromNode: see Request.FromNode), checks that it may make calls,
// and finds the project t names among those it may reach. Every refusal is
// a *Refusal. a is the caller's, so that one Admission (on the heap: the
// hooks are func values) serves both of a start's admissions.
func (p *Pipeline) resolve(secret string, t Target, a *Admission) (Caller, *Refusal) {
	var look store.StartLookup
	var wrong *WrongProtocolError
	if t.ModelKey != "" && p.cfg.StartLookup != nil {
		look = p.cfg.StartLookup(secret, t.ModelKey) // key and project in one read
	} else {
		look.Key, look.KeyErr = p.cfg.Store.Authenticate(secret)
	}
	key, ref := p.key(look.Key, look.KeyErr)
	if ref != nil {
		return Caller{}, ref
	}
	a.Key = key
	release, ref := p.admit(p.cfg.KeyHooks, a)
	if ref != nil {
		return Caller{}, ref
	}
	release() // the key's hooks take, and hold nothing past resolve (a rate's token)
	if !key.Allows(store.PermInfer) {
		return Caller{}, &Refusal{Kind: RefusedScope, Key: key, Err: errScope}
	}
	var proj store.Project
	var err error
	switch {
	case t.ModelKey != "" && p.cfg.StartLookup != nil:
		proj, err = look.Project, look.ProjectErr
	case t.ModelKey != "":
		proj, err = p.cfg.Store.ProjectByModelKey(t.ModelKey)
	case t.ProjectID != "":
		proj, err = p.cfg.Store.GetProject(t.ProjectID)
	default:
		proj, err = p.names.resolve(key, t.ModelName)
	}
	switch {
	case errors.As(err, &wrong):
		return Caller{}, &Refusal{Kind: RefusedRequest, Key: key, Err: err}
	case errors.Is(err, store.ErrNotFound):
		return Caller{}, &Refusal{Kind: RefusedProject, Err: errNoProject}
	case err != nil:
		return Caller{}, refused(err)
	case !Reaches(key, proj.TeamID, proj.ID):
		// Never reveal a project the key may not reach, another team's or
		// one outside its allowlist: the answer is a missing one's.
		return Caller{}, &Refusal{Kind: RefusedProject, Err: errNoProject}
	}
	return Caller{Key: key, Project: proj}, nil
}

// operator resolves an operator's request (Request.Operator): no key, and
// the project of any team by its id.
func (p *Pipeline) operator(t Target) (Caller, *Refusal) {
	if t.ProjectID == "" {
		return Caller{}, &Refusal{Kind: RefusedProject, Err: errNoProject}
	}
	proj, err := p.cfg.Store.GetProject(t.ProjectID)
	switch {
	case errors.Is(err, store.ErrNotFound):
		return Caller{}, &Refusal{Kind: RefusedProject, Err: errNoProject}
	case err != nil:
		return Caller{}, refused(err)
	}
	return Caller{Project: proj}, nil
}

var (
	errScope     = errors.New("this key may not make calls")
	errNoProject = errors.New("project not found")
	errBadKey    = errors.New("invalid API key")
	errExpired   = errors.New("API key expired")
)

// key checks an authenticated key: unknown, malformed and revoked keys are
// all RefusedKey, which never says which; an expired key is told so (only
// its holder can know its secret).
func (p *Pipeline) key(key store.APIKey, err error) (store.APIKey, *Refusal) {
	switch {
	case errors.Is(err, store.ErrInvalidKey), errors.Is(err, store.ErrNotFound):
		return key, &Refusal{Kind: RefusedKey, Err: errBadKey}
	case err != nil:
		return key, refused(err)
	case key.IsRevoked():
		return key, &Refusal{Kind: RefusedKey, Err: errBadKey}
	case key.ExpiredAt(p.cfg.now()):
		return key, &Refusal{Kind: RefusedKeyExpired, Err: errExpired}
	}
	return key, nil
}

// Model is the project of protocol openai that an OpenAI request of key
// naming model reaches (its id, then an alias, among the projects key
// may call), or store.ErrNotFound: GET /v1/models/{model}.
func (p *Pipeline) Model(key store.APIKey, model string) (store.Project, error) {
	proj, err := p.names.resolve(key, model)
	var wrong *WrongProtocolError
	if errors.As(err, &wrong) || err == nil && !Reaches(key, proj.TeamID, proj.ID) {
		return store.Project{}, store.ErrNotFound // the model list has it not either
	}
	return proj, err
}

// Models are the projects of protocol openai that key may call (its
// team's within its project allowlist, every team's for an admin key),
// sorted by id: GET /v1/models. Each is the caller's own copy.
func (p *Pipeline) Models(key store.APIKey) ([]store.Project, error) {
	idx, err := p.names.of(key)
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []store.Project
	for _, proj := range idx.names {
		// The index is the key's team's (every team's for an admin key):
		// the allowlist is what is left to apply.
		if !seen[proj.ID] && key.ReachesProject(proj.ID) {
			seen[proj.ID] = true
			out = append(out, proj.Clone())
		}
	}
	slices.SortFunc(out, func(a, b store.Project) int { return strings.Compare(a.ID, b.ID) })
	return out, nil
}

// Reaches reports whether key may see project projectID of teamID: its
// team's (or any, for an admin key) and within its project allowlist.
func Reaches(key store.APIKey, teamID, projectID string) bool {
	return (key.Scope == store.ScopeAdmin || key.TeamID == teamID) && key.ReachesProject(projectID)
}

// names resolves OpenAI model names: per team (every team's, for an admin
// key: ""), a map from each name of its projects of protocol openai (id
// first, then aliases, as store.ResolveModel decides) to the project, built
// from one ListProjects and kept until a project changes (Changed). A
// request's lookup is then one map read, however many projects the team
// has; a change costs the next request of each team one list.
type names struct {
	list func(teamID string) ([]store.Project, error)

	mu    sync.Mutex
	gen   uint64 // bumped by every change: a list read across one is not kept
	teams map[string]modelIndex
}

// modelIndex is a team's: the projects of protocol openai by each of their
// names, and the others by id (to say why such a name is refused).
type modelIndex struct {
	names  map[string]store.Project
	others map[string]store.Project
}

// WrongProtocolError is the resolve of an OpenAI model name that is the id
// of a project of another protocol, which the key may reach: the OpenAI
// routes do not call it, and the error says how to.
type WrongProtocolError struct{ Project store.Project }

func (e *WrongProtocolError) Error() string {
	id := e.Project.ID
	return fmt.Sprintf("model %q is project %s of protocol %s, which the OpenAI routes do not call: "+
		"call it with POST /run/%s/ROUTE or POST /start/v4 (or give it protocol openai)", id, id, e.Project.Model.Protocol, id)
}

func (n *names) resolve(key store.APIKey, model string) (store.Project, error) {
	idx, err := n.of(key)
	if err != nil {
		return store.Project{}, err
	}
	p, ok := idx.names[model]
	if !ok || !key.ReachesProject(p.ID) {
		// An alias of a project outside the key's allowlist may name
		// another project of the team that it reaches: resolve among
		// those alone, as a key limited to them would see the team.
		if p, ok = n.reachable(idx.names, key, model); !ok {
			if o, ok := idx.others[model]; ok && Reaches(key, o.TeamID, o.ID) {
				return store.Project{}, &WrongProtocolError{Project: o}
			}
			return store.Project{}, store.ErrNotFound
		}
	}
	return p.Clone(), nil // the caller's own: the index is every request's
}

// of is the index of key's team (every team's for an admin key), read
// once until a project changes.
func (n *names) of(key store.APIKey) (modelIndex, error) {
	team := key.TeamID
	if key.Scope == store.ScopeAdmin {
		team = ""
	}
	n.mu.Lock()
	idx, ok := n.teams[team]
	gen := n.gen
	n.mu.Unlock()
	if ok {
		return idx, nil
	}
	ps, err := n.list(team)
	if err != nil {
		return modelIndex{}, err
	}
	idx = index(ps)
	n.mu.Lock()
	if n.gen == gen { // nothing changed while it was read
		if n.teams == nil {
			n.teams = map[string]modelIndex{}
		}
		n.teams[team] = idx
	}
	n.mu.Unlock()
	return idx, nil
}

// reachable resolves model among the projects of idx that key reaches
// (the slow path of a key with a project allowlist).
func (n *names) reachable(idx map[string]store.Project, key store.APIKey, model string) (store.Project, bool) {
	var ps []store.Project
	seen := map[string]bool{}
	for _, p := range idx {
		if !seen[p.ID] && key.ReachesProject(p.ID) {
			seen[p.ID] = true
			ps = append(ps, p)
		}
	}
	return store.ResolveModel(ps, model)
}

// index maps every name of ps's projects of protocol openai to its
// project, as store.ResolveModel would resolve it, and the other
// projects by id.
func index(ps []store.Project) modelIndex {
	idx := modelIndex{names: make(map[string]store.Project, len(ps)), others: map[string]store.Project{}}
	for _, p := range ps {
		if p.Model.Protocol != store.ProtocolOpenAI {
			idx.others[p.ID] = p
			continue
		}
		for _, name := range p.ModelNames() {
			if _, ok := idx.names[name]; !ok {
				if q, ok := store.ResolveModel(ps, name); ok {
					idx.names[name] = q
				}
			}
		}
	}
	return idx
}

// changed forgets every team's index: a project was created, changed or
// deleted.
func (n *names) changed() {
	n.mu.Lock()
	n.gen++
	n.teams = nil
	n.mu.Unlock()
}

// clock is time.Now, or a test's.
func (c Config) now() time.Time {
	if c.Now != nil {
		return c.Now()
	}
	return time.Now()
}
