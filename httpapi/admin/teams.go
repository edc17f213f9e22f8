package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/scheduler"
	"inferd/store"
)

// WithTeamUse makes GET /admin/teams show each team's current use beside
// its quota (the scheduler's Snapshot().Teams). Without it, as when the CLI
// runs the admin API on the data file with no daemon, use is left out.
func WithTeamUse(use func() []scheduler.TeamStatus) Option {
	return func(a *admin) { a.teamUse = use }
}

// teamView is a team with its quota and, when a daemon runs, its use.
type teamView struct {
	store.Team
	Use *scheduler.TeamStatus `json:"use,omitempty"`
}

type teamList struct {
	Results []teamView `json:"results"`
}

// listTeams handles GET /admin/teams.
func (a *admin) listTeams(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	teams, err := a.store.ListTeams()
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	holders, err := a.adminKeyHolders(teams)
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	var use []scheduler.TeamStatus
	if a.teamUse != nil {
		use = a.teamUse()
	}
	out := teamList{Results: make([]teamView, 0, len(teams))}
	for _, t := range teams {
		if holders[t.ID] {
			continue
		}
		v := teamView{Team: t}
		if i := slices.IndexFunc(use, func(u scheduler.TeamStatus) bool { return u.ID == t.ID }); i >= 0 {
			v.Use = &use[i]
		} else if a.teamUse != nil {
			v.Use = &scheduler.TeamStatus{ID: t.ID, Quota: t.Quota}
		}
		out.Results = append(out.Results, v)
	}
	respond.JSON(w, http.StatusOK, out)
}

// setTeamRequest keeps the quota raw: it is decoded strictly (decodeQuota).
type setTeamRequest struct {
	Quota json.RawMessage `json:"quota"`
}

// decodeQuota decodes a quota object and refuses a field this version does
// not know: a typo would otherwise leave that limit unlimited without a word.
func decodeQuota(raw json.RawMessage) (store.Quota, error) {
	var q store.Quota
	if respond.IsAbsent(raw) {
		return q, respond.BadRequest("missing quota; send {\"quota\": {...}} (an empty quota is unlimited)")
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&q); err != nil {
		return q, respond.BadRequest("quota: %s", strings.TrimPrefix(err.Error(), "json: "))
	}
	if err := q.Validate(); err != nil {
		return q, err
	}
	return q, nil
}

type setTeamResponse struct {
	Team     store.Team `json:"team"`
	Warnings []string   `json:"warnings,omitempty"`
}

// setTeam handles PUT /admin/teams/:id {"quota": {...}}: the team's whole
// quota is replaced (absent fields are unlimited) and the team created if
// missing. A quota below what the team's projects already guarantee is
// set all the same, with a warning: an admin may tighten a team, and its
// projects' minimums then wait within the quota.
func (a *admin) setTeam(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	if err := validateTeam(id); err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	var req setTeamRequest
	if err := readAdminJSON(w, r, &req); err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	quota, err := decodeQuota(req.Quota)
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	projects, err := a.store.ListProjects(id)
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	t, err := a.store.SetTeamQuota(id, quota)
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	out := setTeamResponse{Team: t}
	if err := quota.CheckProjects(id, projects); err != nil {
		out.Warnings = append(out.Warnings, err.Error()+"; lower the projects' minReplicas")
	}
	respond.JSON(w, http.StatusOK, out)
}

// setQuotas checks an apply against its teams' quotas and sets the quotas
// it lists. The check covers every team an applied project belongs to, with
// the quota the manifest gives it or else the stored one, over the team's
// projects as they will be (stored ones the apply leaves alone included),
// whose OpenAI model names must not clash (store.CheckModelNames); and
// every applied project against its own caps. Quotas are set before
// the projects are written, so a project write that then fails (a modelKey
// conflict) leaves the new quotas in place, never projects over a quota.
func (a *admin) setQuotas(teams []store.Team, projects []store.Project) error {
	quotas := map[string]store.Quota{}
	for i, t := range teams {
		if err := validateTeam(t.ID); err != nil {
			return respond.BadRequest("team %d: %s", i+1, err.Error())
		}
		if _, dup := quotas[t.ID]; dup {
			return respond.BadRequest("team %s: listed twice", t.ID)
		}
		if err := t.Quota.Validate(); err != nil {
			return respond.BadRequest("team %s: %s", t.ID, err.Error())
		}
		quotas[t.ID] = t.Quota
	}
	byTeam := map[string][]store.Project{}
	for _, p := range projects {
		if err := p.CheckCaps(); err != nil {
			return respond.BadRequest("project %s: %s", p.ID, err.Error())
		}
		byTeam[p.TeamID] = append(byTeam[p.TeamID], p)
	}
	ids := slices.Collect(maps.Keys(byTeam))
	for id := range quotas {
		if _, ok := byTeam[id]; !ok {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids) // the same team is named first every time
	for _, team := range ids {
		applied := byTeam[team]
		q, listed := quotas[team]
		if !listed {
			t, err := a.store.GetTeam(team)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return fmt.Errorf("read team %s: %w", team, err)
			}
			q = t.Quota
		}
		stored, err := a.store.ListProjects(team)
		if err != nil {
			return err
		}
		all := slices.DeleteFunc(stored, func(s store.Project) bool {
			return slices.ContainsFunc(applied, func(p store.Project) bool { return p.ID == s.ID })
		})
		all = append(all, applied...)
		if err := q.CheckProjects(team, all); err != nil {
			return respond.BadRequest("%s (nothing was applied)", err.Error())
		}
		if err := store.CheckModelNames(all); err != nil {
			return respond.BadRequest("%s (nothing was applied)", err.Error())
		}
	}
	for _, t := range teams {
		if _, err := a.store.SetTeamQuota(t.ID, t.Quota); err != nil {
			return err
		}
	}
	return nil
}

// adminKeyHolders returns the teams that only hold admin keys: the team an
// admin key needs (inferd key create --admin makes one called admin), with
// no team key, no project and no quota of its own. An admin key reaches every
// team, so such a team is no tenant, and team list leaves it out.
func (a *admin) adminKeyHolders(teams []store.Team) (map[string]bool, error) {
	keys, err := a.store.ListKeys("")
	if err != nil {
		return nil, err
	}
	projects, err := a.store.ListProjects("")
	if err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for _, k := range keys {
		if k.Scope == store.ScopeAdmin {
			out[k.TeamID] = true
		}
	}
	for _, k := range keys {
		if k.Scope != store.ScopeAdmin {
			delete(out, k.TeamID)
		}
	}
	for _, p := range projects {
		delete(out, p.TeamID)
	}
	for _, t := range teams {
		if t.Quota != (store.Quota{}) {
			delete(out, t.ID)
		}
	}
	return out, nil
}
