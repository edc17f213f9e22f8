package admin

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/rs/zerolog"

	"inferd/httpapi/respond"
	"inferd/httpapi/usage"
	"inferd/scheduler"
	"inferd/scheduler/backend"
	"inferd/store"
)

// maxAdminBody caps admin request bodies (an apply carries every project).
const maxAdminBody = 10 << 20

// Store is what the admin API needs from a store.Store.
type Store interface {
	ListTeams() ([]store.Team, error)
	GetTeam(id string) (store.Team, error)
	SetTeamQuota(id string, q store.Quota) (store.Team, error)
	CreateScopedKey(teamID string, scope store.KeyScope, lim store.KeyLimits) (secret string, k store.APIKey, err error)
	ListKeys(teamID string) ([]store.APIKey, error)
	RevokeKey(id string) error
	PutProjects(ps []store.Project) ([]store.Change, error) // all or nothing
	ListProjects(teamID string) ([]store.Project, error)
	GetProject(id string) (store.Project, error)
	DeleteProject(id string) error
	UpdateProject(id string, fn func(*store.Project) error) (store.Project, error)
	WebhookSecret(teamID string, rotate bool) (string, error)
	usage.Reader // GET /admin/usage (usage.go)
}

// BackupWriter is the optional part of a Store that serves
// GET /admin/backup; *bolt.Store has it. A store without it answers 501.
type BackupWriter interface {
	WriteBackup(w io.Writer) (int64, error)
}

type admin struct {
	store       Store
	log         zerolog.Logger
	capacity    func([]store.Project) []string
	modelCheck  ModelCheck                    // nil = none
	replicaLogs backend.Logs                  // nil = none (see WithLogs)
	teamUse     func() []scheduler.TeamStatus // nil = no daemon: use unknown (see WithTeamUse)
	cancel      CallCanceller                 // nil = none (see WithCancel)
	calls       http.Handler                  // nil = no calls (see WithCalls)
}

// Option adjusts the admin API.
type Option func(*admin)

// WithCapacityCheck makes apply report as warnings what check says of all
// projects once the apply is done (the scheduler's CapacityWarnings: whether
// every minReplicas fits on the machine). Warnings reject nothing.
func WithCapacityCheck(check func([]store.Project) []string) Option {
	return func(a *admin) { a.capacity = check }
}

// ModelCheck says what would keep a model from starting on this machine as
// the daemon would run it (problems: no such dir or program, or one the model
// user cannot read or run), and what will not work as meant (warnings: more
// GPUs than the machine has, a protocol that looks wrong). Each text says
// what to do.
type ModelCheck func(m store.ModelSpec) (problems, warnings []string)

// WithModelCheck makes apply check every project's model before it stores
// anything: a problem refuses the whole apply, a warning is reported.
func WithModelCheck(check ModelCheck) Option {
	return func(a *admin) { a.modelCheck = check }
}

// New returns the admin API: teams, keys and declarative project
// upserts. It has no authentication of its own: the daemon serves it only on
// a unix socket with mode 0600, and the CLI calls it in-process when no
// daemon runs.
func New(st Store, log zerolog.Logger, opts ...Option) http.Handler {
	a := &admin{store: st, log: log}
	for _, o := range opts {
		o(a)
	}
	r := respond.NewRouter(a.recoverPanic, respond.Refused)
	r.POST("/admin/keys", a.createKey)
	r.GET("/admin/keys", a.listKeys)
	r.POST("/admin/keys/:id/revoke", a.revokeKey)
	r.POST("/admin/apply", a.apply)
	r.GET("/admin/projects", a.listProjects)
	r.DELETE("/admin/projects/:id", a.deleteProject)
	r.POST("/admin/projects/:id/restart", a.restartProject)
	r.POST("/admin/projects/:id/call", a.runCall)
	r.GET("/admin/teams", a.listTeams)
	r.PUT("/admin/teams/:id", a.setTeam)
	r.POST("/admin/teams/:id/webhook-secret", a.webhookSecret)
	r.GET("/admin/backup", a.backup)
	r.GET("/admin/logs/:project", a.logs)
	r.POST("/admin/calls/:id/cancel", a.cancelCall)
	r.GET("/admin/usage", a.usage)
	return respond.WithRequestLog(r, log)
}

func (a *admin) recoverPanic(w http.ResponseWriter, r *http.Request, v any) {
	if respond.LogPanic(w, r, a.log, v) {
		respond.JSON(w, http.StatusInternalServerError, respond.Refusal(respond.CodeInternal,
			"internal error; see the server log for request id "+respond.RequestID(w)))
	}
}

// keyView is an API key without its hash. Revoked is null while the key is
// valid; the field names match store.APIKey so a client may decode into it.
// Permissions are absent for a key that holds all three (and an admin key),
// Expires null for a key that never expires, Projects absent for a key
// that reaches every project of its team.
type keyView struct {
	ID          string             `json:"id"`
	TeamID      string             `json:"teamId"`
	Scope       store.KeyScope     `json:"scope"`
	Permissions []store.Permission `json:"permissions,omitempty"`
	Expires     *time.Time         `json:"expires"`
	Projects    []string           `json:"projects,omitempty"`
	Created     time.Time          `json:"created"`
	Revoked     *time.Time         `json:"revoked"`
}

func viewKey(k store.APIKey) keyView {
	v := keyView{ID: k.ID, TeamID: k.TeamID, Scope: k.Scope, Permissions: k.Permissions, Projects: k.Projects, Created: k.Created}
	if !k.Expires.IsZero() {
		t := k.Expires
		v.Expires = &t
	}
	if k.IsRevoked() {
		t := k.Revoked
		v.Revoked = &t
	}
	return v
}

type createKeyRequest struct {
	Team  string         `json:"team"`
	Scope store.KeyScope `json:"scope"`
	// The key's limits (a team key only): permissions, expiry, projects.
	Permissions []store.Permission `json:"permissions"`
	Expires     time.Time          `json:"expires"`
	Projects    []string           `json:"projects"`
}

type createKeyResponse struct {
	Secret string  `json:"secret"`
	Key    keyView `json:"key"`
}

// createKey handles POST /admin/keys {"team": T, "scope": "team"|"admin",
// "permissions": [...], "expires": RFC3339, "projects": [...]}: the team is
// created if missing, and the secret is shown this once.
func (a *admin) createKey(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	var req createKeyRequest
	if err := readAdminJSON(w, r, &req); err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	if err := validateTeam(req.Team); err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	switch req.Scope {
	case "":
		req.Scope = store.ScopeTeam
	case store.ScopeTeam, store.ScopeAdmin:
	default:
		respond.Error(w, r, a.log, respond.BadRequest("scope must be %q or %q", store.ScopeTeam, store.ScopeAdmin))
		return
	}
	lim := store.KeyLimits{Permissions: req.Permissions, Expires: req.Expires, Projects: req.Projects}
	if !lim.Expires.IsZero() && !lim.Expires.After(time.Now()) {
		respond.Error(w, r, a.log, respond.BadRequest("expires %s is not in the future", lim.Expires.Format(time.RFC3339)))
		return
	}
	secret, key, err := a.store.CreateScopedKey(req.Team, req.Scope, lim)
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	respond.JSON(w, http.StatusCreated, createKeyResponse{Secret: secret, Key: viewKey(key)})
}

type keyList struct {
	Results []keyView `json:"results"`
}

// listKeys handles GET /admin/keys[?team=T].
func (a *admin) listKeys(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	keys, err := a.store.ListKeys(r.URL.Query().Get("team"))
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	out := keyList{Results: make([]keyView, 0, len(keys))}
	for _, k := range keys {
		out.Results = append(out.Results, viewKey(k))
	}
	respond.JSON(w, http.StatusOK, out)
}

type keyResponse struct {
	Key keyView `json:"key"`
}

// revokeKey handles POST /admin/keys/:id/revoke; revoking twice is fine.
func (a *admin) revokeKey(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	if err := a.store.RevokeKey(id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = respond.NotFound("key %s not found", respond.Truncate(id, 64))
		}
		respond.Error(w, r, a.log, err)
		return
	}
	keys, err := a.store.ListKeys("")
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	for _, k := range keys {
		if k.ID == id {
			respond.JSON(w, http.StatusOK, keyResponse{viewKey(k)})
			return
		}
	}
	respond.Error(w, r, a.log, respond.NotFound("key %s not found", respond.Truncate(id, 64)))
}

type applyRequest struct {
	Teams    []store.Team    `json:"teams"` // id and quota of each team the manifest lists
	Projects []store.Project `json:"projects"`
}

type applyChange struct {
	Project string `json:"project"`
	Team    string `json:"team"`
	Change  string `json:"change"` // created, updated or unchanged
	// Detail says, for an update, what changed and what the daemon does
	// about it (describeUpdate).
	Detail string `json:"detail,omitempty"`
}

type applyResponse struct {
	Changes  []applyChange `json:"changes"`
	Warnings []string      `json:"warnings,omitempty"` // the apply went through; these say what will not work as hoped
}

// apply handles POST /admin/apply {"teams": [...], "projects": [...]}:
// every project is validated first, and checked against its caps and its
// team's quota (the manifest's, else the stored one); then the teams'
// quotas are set and all projects upserted (teams created if missing) in one
// transaction, so a conflict leaves no project applied; the changes are
// reported in order.
func (a *admin) apply(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	var req applyRequest
	if err := readAdminJSON(w, r, &req); err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	seen := make(map[string]bool, len(req.Projects))
	for i, p := range req.Projects {
		name := fmt.Sprintf("project %d", i+1)
		if p.ID != "" {
			name = "project " + respond.Truncate(p.ID, 64)
		}
		if seen[p.ID] {
			respond.Error(w, r, a.log, respond.BadRequest("%s: listed twice", name))
			return
		}
		seen[p.ID] = true
		if err := p.Validate(); err != nil {
			var ve *store.ValidationError
			if errors.As(err, &ve) {
				err = respond.BadRequest("%s: %s", name, ve.Error())
			}
			respond.Error(w, r, a.log, err)
			return
		}
	}
	before, err := a.reapply(req.Projects)
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	problems, warnings := a.checkModels(req.Projects)
	if len(problems) > 0 {
		respond.Error(w, r, a.log, respond.BadRequest("these models cannot start on this machine (nothing was applied):\n  %s", strings.Join(problems, "\n  ")))
		return
	}
	if err := a.setQuotas(req.Teams, req.Projects); err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	changes, err := a.store.PutProjects(req.Projects)
	if err != nil {
		if errors.Is(err, store.ErrConflict) {
			err = &respond.Problem{Status: http.StatusConflict, Code: respond.CodeConflict, Msg: err.Error() + " (nothing was applied)"}
		}
		respond.Error(w, r, a.log, err)
		return
	}
	out := applyResponse{Changes: make([]applyChange, len(req.Projects))}
	for i, p := range req.Projects {
		out.Changes[i] = applyChange{Project: p.ID, Team: p.TeamID, Change: string(changes[i])}
		if changes[i] == store.ChangeUpdated {
			out.Changes[i].Detail = describeUpdate(before[p.ID], p)
		}
	}
	out.Warnings = append(warnings, a.capacityWarnings()...)
	respond.JSON(w, http.StatusOK, out)
}

// reapply turns each project of an apply into a declaration merged with the
// stored project (store.Reapply, as kubectl apply does): what the manifest
// did not change since its last apply keeps the value the project API set.
// The checks that follow see the projects as they will be stored; the store
// merges again as it writes, so a project API write in between is kept too.
// It returns the stored projects by id, for describeUpdate.
func (a *admin) reapply(ps []store.Project) (map[string]store.Project, error) {
	before := make(map[string]store.Project, len(ps))
	for i, p := range ps {
		p = p.Declared()
		stored, err := a.store.GetProject(p.ID)
		switch {
		case errors.Is(err, store.ErrNotFound):
		case err != nil:
			return nil, err
		default:
			before[p.ID] = stored
			merged, err := store.Reapply(stored, p)
			var ve *store.ValidationError
			if errors.As(err, &ve) {
				return nil, respond.BadRequest("project %s: %s (nothing was applied)", respond.Truncate(p.ID, 64), ve.Error())
			}
			if err != nil {
				return nil, err
			}
			p = merged
		}
		ps[i] = p
	}
	return before, nil
}

// describeUpdate says what an update of stored to p changed and what the
// daemon does about it: a field that says how replicas start (the model's
// command, env, revision: its code) replaces them one by one; any other
// takes effect with the running replicas kept.
func describeUpdate(stored, p store.Project) string {
	names := store.ChangedFields(stored, p)
	if len(names) == 0 {
		return ""
	}
	old, next := map[string]int{"minReplicas": stored.MinReplicas, "maxReplicas": stored.MaxReplicas,
		"inferenceTimeout": stored.InferenceTimeout, "idleTimeout": stored.IdleTimeout, "retries": stored.Retries},
		map[string]int{"minReplicas": p.MinReplicas, "maxReplicas": p.MaxReplicas,
			"inferenceTimeout": p.InferenceTimeout, "idleTimeout": p.IdleTimeout, "retries": p.Retries}
	for i, n := range names {
		switch {
		case n == "revision" && strings.HasPrefix(p.Model.Revision, "dir:"):
			names[i] = "the files in dir"
		case n == "revision":
			names[i] = fmt.Sprintf("revision %q -> %q", stored.Model.Revision, p.Model.Revision)
		default:
			if v, ok := next[n]; ok {
				names[i] = fmt.Sprintf("%s %d -> %d", n, old[n], v)
			}
		}
	}
	if stored.Model.RestartNeeded(p.Model) {
		return strings.Join(names, ", ") + ": replacing its replicas one by one (each new one ready before an old one stops)"
	}
	return strings.Join(names, ", ") + ": in effect now, running replicas kept"
}

// checkModels runs the model check, if there is one, on each project of an
// apply, naming the project in each finding.
func (a *admin) checkModels(ps []store.Project) (problems, warnings []string) {
	if a.modelCheck == nil {
		return nil, nil
	}
	for _, p := range ps {
		pr, w := a.modelCheck(p.Model)
		for _, t := range pr {
			problems = append(problems, "project "+p.ID+": "+t)
		}
		for _, t := range w {
			warnings = append(warnings, "project "+p.ID+": "+t)
		}
	}
	return problems, warnings
}

// capacityWarnings runs the capacity check on every project, if there is
// one. The apply has succeeded by now, so a failed read only costs the
// warnings.
func (a *admin) capacityWarnings() []string {
	if a.capacity == nil {
		return nil
	}
	all, err := a.store.ListProjects("")
	if err != nil {
		a.log.Warn().Err(err).Msg("apply: listing projects for the capacity check failed")
		return nil
	}
	// In id order, so that the warnings come in the same order every time.
	slices.SortFunc(all, func(x, y store.Project) int { return strings.Compare(x.ID, y.ID) })
	return a.capacity(all)
}

// adminProjectList is GET /admin/projects: whole store projects, model spec
// and last applied declaration included, each without its modelKey hash
// (KeyHash is omitted when empty).
type adminProjectList struct {
	Results []store.Project `json:"results"`
}

// listProjects handles GET /admin/projects[?team=T], sorted by id.
func (a *admin) listProjects(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	projects, err := a.store.ListProjects(r.URL.Query().Get("team"))
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	slices.SortFunc(projects, func(x, y store.Project) int { return strings.Compare(x.ID, y.ID) })
	out := adminProjectList{Results: make([]store.Project, 0, len(projects))}
	for _, p := range projects {
		p.Model.KeyHash = ""
		if p.LastApplied != nil {
			p.LastApplied = new(p.LastApplied.Clone())
			p.LastApplied.Model.KeyHash = ""
		}
		out.Results = append(out.Results, p)
	}
	respond.JSON(w, http.StatusOK, out)
}

type deletedResponse struct {
	Deleted string `json:"deleted"`
}

// deleteProject handles DELETE /admin/projects/:id.
func (a *admin) deleteProject(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	if err := a.store.DeleteProject(id); err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = respond.NotFound("project %s not found", respond.Truncate(id, 64))
		}
		respond.Error(w, r, a.log, err)
		return
	}
	respond.JSON(w, http.StatusOK, deletedResponse{Deleted: id})
}

// restartResponse answers a restart: the project, and how many times it
// has been restarted.
type restartResponse struct {
	Project  string `json:"project"`
	Restarts int    `json:"restarts"`
}

// restartProject handles POST /admin/projects/:id/restart: it counts one
// more restart in the project's model spec (store.ModelSpec.Restarts), a
// change that replaces its running replicas one by one, on this node and
// on every node of a cluster, as any change to how they start does.
func (a *admin) restartProject(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	id := ps.ByName("id")
	p, err := a.store.UpdateProject(id, func(p *store.Project) error {
		p.Model.Restarts++
		return nil
	})
	if err != nil {
		if errors.Is(err, store.ErrNotFound) {
			err = respond.NotFound("project %s not found", respond.Truncate(id, 64))
		}
		respond.Error(w, r, a.log, err)
		return
	}
	respond.JSON(w, http.StatusOK, restartResponse{Project: id, Restarts: p.Model.Restarts})
}

// backup handles GET /admin/backup: a consistent snapshot of the data file,
// streamed as it is written. A failure after the first byte cannot change the
// status any more; it aborts the response so the client sees a short body.
func (a *admin) backup(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	bw, ok := a.store.(BackupWriter)
	if !ok {
		respond.Error(w, r, a.log, &respond.Problem{Status: http.StatusNotImplemented, Code: respond.CodeInternal, Msg: "this store cannot write backups"})
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Disposition", `attachment; filename="inferd.db"`)
	cw := &countingWriter{w: w}
	if _, err := bw.WriteBackup(cw); err != nil {
		if cw.n == 0 {
			respond.Error(w, r, a.log, err)
			return
		}
		a.log.Error().Err(err).Int64("written", cw.n).Msg("backup aborted")
		panic(http.ErrAbortHandler)
	}
}

// countingWriter counts the bytes that reached w.
type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// readAdminJSON reads a JSON object body into v.
func readAdminJSON(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := respond.ReadBody(w, r, maxAdminBody)
	if err != nil {
		return err
	}
	return respond.DecodeObject(body, v)
}

// validateTeam checks a team id by the store's rule for ids.
func validateTeam(id string) error {
	switch {
	case id == "":
		return respond.BadRequest("missing team")
	case !store.ValidID(id):
		return respond.BadRequest("team %q: must be 1-64 characters of a-z, 0-9 and -", respond.Truncate(id, 64))
	}
	return nil
}
