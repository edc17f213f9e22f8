package admin

import (
	"errors"
	"net/http"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/store"
)

type webhookSecretRequest struct {
	Rotate bool `json:"rotate"`
}

type webhookSecretResponse struct {
	Team   string `json:"team"`
	Secret string `json:"secret"`
}

// webhookSecret handles POST /admin/teams/:id/webhook-secret {"rotate":
// bool}: the team's webhook signing secret, drawn on first use, or a new
// one with rotate (messages are signed with it from then on, retries of
// older messages included). An empty body reads the secret.
func (a *admin) webhookSecret(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	var req webhookSecretRequest
	if r.ContentLength != 0 {
		if err := readAdminJSON(w, r, &req); err != nil {
			respond.Error(w, r, a.log, err)
			return
		}
	}
	team := ps.ByName("id")
	secret, err := a.store.WebhookSecret(team, req.Rotate)
	if errors.Is(err, store.ErrNotFound) {
		err = respond.NotFound("team %s not found", respond.Truncate(team, 64))
	}
	if err != nil {
		respond.Error(w, r, a.log, err)
		return
	}
	respond.JSON(w, http.StatusOK, webhookSecretResponse{Team: team, Secret: secret})
}
