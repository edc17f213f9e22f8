package admin

import (
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/httpapi/usage"
	"inferd/store"
)

// usage handles GET /admin/usage: every team's usage, as GET /v1/usage
// answers an admin key.
func (a *admin) usage(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	u, err := usage.ParseQuery(r.URL.Query(), time.Now())
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	rep, err := usage.Build(a.store, u, func(store.UsageRow) bool { return true })
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	respond.JSON(w, http.StatusOK, rep)
}
