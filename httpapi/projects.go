package httpapi

import (
	"encoding/json"
	"errors"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/julienschmidt/httprouter"

	"inferd/store"
)

// maxProjectBody caps a PUT body; four integers fit many times over.
const maxProjectBody = 64 << 10

// projectView is a project as the API shows it: the six fields of Banana's
// project API plus retries and durability, never the model spec.
type projectView struct {
	ID               string `json:"id"`
	TeamID           string `json:"teamId"`
	MinReplicas      int    `json:"minReplicas"`
	MaxReplicas      int    `json:"maxReplicas"`
	InferenceTimeout int    `json:"inferenceTimeout"`
	IdleTimeout      int    `json:"idleTimeout"`
	Retries          int    `json:"retries,omitempty"`    // omitted at 0: the six fields stay the Banana shape
	Durability       string `json:"durability,omitempty"` // "answered", or omitted: strict, the default
}

func viewProject(p store.Project) projectView {
	return projectView{
		ID:               p.ID,
		TeamID:           p.TeamID,
		MinReplicas:      p.MinReplicas,
		MaxReplicas:      p.MaxReplicas,
		InferenceTimeout: p.InferenceTimeout,
		IdleTimeout:      p.IdleTimeout,
		Retries:          p.Retries,
		Durability:       p.Durability,
	}
}

type projectList struct {
	Results []projectView `json:"results"`
}

// headerKey authenticates a reading request (project API GETs, status) by
// its X-Service-API-Key (or the original X-Banana-API-Key) header: the key
// needs the read scope.
func (a *api) headerKey(r *http.Request) (store.APIKey, error) {
	return a.headerKeyFor(r, store.PermRead)
}

// headerKeyFor authenticates a project-API request that needs permission p.
func (a *api) headerKeyFor(r *http.Request, p store.Permission) (store.APIKey, error) {
	secret, err := headerSecret(r)
	if err != nil {
		return store.APIKey{}, err
	}
	var key store.APIKey
	if a.fromNode(r) {
		// A request another node forwarded: its rate was spent there.
		key, err = a.store.Authenticate(secret)
		key, err = a.keyValid(key, err, errInvalidHeaderKey)
	} else {
		key, err = a.authenticate(secret, errInvalidHeaderKey)
	}
	if err != nil {
		return store.APIKey{}, err
	}
	return key, requirePermission(key, p)
}

// listProjects handles GET /v1/projects: the caller's projects sorted by id
// (every team's for an admin key).
func (a *api) listProjects(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, err := a.headerKey(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	team := key.TeamID
	if key.Scope == store.ScopeAdmin {
		team = ""
	}
	projects, err := a.store.ListProjects(team)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	slices.SortFunc(projects, func(x, y store.Project) int { return strings.Compare(x.ID, y.ID) })
	out := projectList{Results: make([]projectView, 0, len(projects))}
	for _, p := range projects {
		if mayReach(key, p.TeamID, p.ID) {
			out.Results = append(out.Results, viewProject(p))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// getProject handles GET /v1/projects/:id.
func (a *api) getProject(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.headerKey(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	p, err := a.store.GetProject(ps.ByName("id"))
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, r, a.log, errProjectNotFound)
	case err != nil:
		writeError(w, r, a.log, err)
	case !mayReach(key, p.TeamID, p.ID):
		writeError(w, r, a.log, errProjectNotFound)
	default:
		writeJSON(w, http.StatusOK, viewProject(p))
	}
}

// putProject handles PUT /v1/projects/:id: a partial, atomic update of the
// four updatable fields. On any error nothing changes.
func (a *api) putProject(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.headerKeyFor(r, store.PermManage)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	body, err := a.readBody(w, r, min(a.opts.MaxBodyBytes, maxProjectBody))
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	upd, err := decodeProjectUpdate(body)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	id := ps.ByName("id")
	limits, err := a.teamLimits(id)
	if errors.Is(err, store.ErrNotFound) {
		err = errProjectNotFound
	}
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	p, err := a.store.UpdateProject(id, func(p *store.Project) error {
		if !mayReach(key, p.TeamID, p.ID) {
			return errNotYours
		}
		upd.apply(p)
		if err := p.Validate(); err != nil {
			return err
		}
		return limits.check(*p)
	})
	switch {
	case errors.Is(err, store.ErrNotFound), errors.Is(err, errNotYours):
		writeError(w, r, a.log, errProjectNotFound)
	case err != nil:
		writeError(w, r, a.log, err)
	default:
		writeJSON(w, http.StatusOK, viewProject(p))
	}
}

// teamLimits reads what bounds a PUT of project id besides its own fields:
// its team's quota and the team's other projects, whose minimums share it.
// They are read before the update (its fn may not call the store), so two
// PUTs racing on projects of one team may together pass a quota that each
// alone keeps; the scheduler still holds the team to its quota.
func (a *api) teamLimits(id string) (projectLimits, error) {
	cur, err := a.store.GetProject(id)
	if err != nil {
		return projectLimits{}, err // ErrNotFound answers as a missing project
	}
	team, err := a.store.GetTeam(cur.TeamID)
	if err != nil && !errors.Is(err, store.ErrNotFound) {
		return projectLimits{}, err
	}
	others, err := a.store.ListProjects(cur.TeamID)
	if err != nil {
		return projectLimits{}, err
	}
	others = slices.DeleteFunc(others, func(p store.Project) bool { return p.ID == id })
	return projectLimits{quota: team.Quota, others: others}, nil
}

// projectLimits bound a project update: the project's admin caps and its
// team's quota.
type projectLimits struct {
	quota  store.Quota
	others []store.Project // the team's other projects
}

// check returns the *store.QuotaError of p going beyond its team's quota
// or its caps (a 400 that names the limit; the team's quota first).
func (l projectLimits) check(p store.Project) error {
	if err := l.quota.CheckProjects(p.TeamID, append(slices.Clone(l.others), p)); err != nil {
		return err
	}
	return p.CheckCaps()
}

// updatable lists the attributes a PUT may set, in the order messages name them.
var updatable = []string{"minReplicas", "maxReplicas", "inferenceTimeout", "idleTimeout", "retries"}

// projectUpdate holds the attributes a PUT supplied; nil means keep.
type projectUpdate struct {
	MinReplicas, MaxReplicas, InferenceTimeout, IdleTimeout, Retries *int
}

func (u projectUpdate) apply(p *store.Project) {
	set := func(dst *int, v *int) {
		if v != nil {
			*dst = *v
		}
	}
	set(&p.MinReplicas, u.MinReplicas)
	set(&p.MaxReplicas, u.MaxReplicas)
	set(&p.InferenceTimeout, u.InferenceTimeout)
	set(&p.IdleTimeout, u.IdleTimeout)
	set(&p.Retries, u.Retries)
}

// decodeProjectUpdate parses a PUT body strictly: a JSON object with one or
// more of the updatable attributes, each a JSON integer (5, not 5.0, "5",
// true or null); anything else is a 400 naming the attribute.
func decodeProjectUpdate(body []byte) (projectUpdate, error) {
	var u projectUpdate
	var fields map[string]json.RawMessage
	if err := decodeObject(body, &fields); err != nil {
		return u, err
	}
	if len(fields) == 0 {
		return u, badRequest("supply at least one of %s", strings.Join(updatable, ", "))
	}
	names := make([]string, 0, len(fields))
	for name := range fields {
		names = append(names, name)
	}
	slices.Sort(names) // report the same problem first every time
	for _, name := range names {
		var dst **int
		switch name {
		case "minReplicas":
			dst = &u.MinReplicas
		case "maxReplicas":
			dst = &u.MaxReplicas
		case "inferenceTimeout":
			dst = &u.InferenceTimeout
		case "idleTimeout":
			dst = &u.IdleTimeout
		case "retries":
			dst = &u.Retries
		case "id", "teamId":
			return u, badRequest("%s cannot be changed; updatable: %s", name, strings.Join(updatable, ", "))
		default:
			return u, badRequest("unknown attribute %s; updatable: %s",
				strconv.Quote(truncate(name, 64)), strings.Join(updatable, ", "))
		}
		v, err := jsonInt(name, fields[name])
		if err != nil {
			return u, err
		}
		*dst = &v
	}
	return u, nil
}

// jsonInt parses a JSON integer literal: an optional minus and digits only.
func jsonInt(name string, raw json.RawMessage) (int, error) {
	s := string(raw)
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, badRequest("%s must be an integer, got %s", name, truncate(s, 32))
	}
	v, err := strconv.Atoi(s)
	if err != nil {
		return 0, badRequest("%s is out of range: %s", name, truncate(s, 32))
	}
	return v, nil
}
