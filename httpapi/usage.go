package httpapi

import (
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/usage"
	"inferd/store"
)

// usage handles GET /v1/usage: the caller's team's usage (every team's for
// an admin key), within its project allowlist.
func (a *api) usage(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, err := a.headerKey(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	u, err := usage.ParseQuery(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	if key.Scope != store.ScopeAdmin {
		if u.Team != "" && u.Team != key.TeamID {
			writeError(w, r, a.log, notFound("team not found"))
			return
		}
		u.Team = key.TeamID // the store reads this team's rows only
	}
	rep, err := usage.Build(a.store, u, func(row store.UsageRow) bool { return key.ReachesProject(row.ProjectID) })
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}
