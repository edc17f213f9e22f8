package respond

import (
	"errors"
	"net/http"

	"github.com/rs/zerolog"

	"inferd/scheduler"
	"inferd/store"
)

// Cancelled answers a cancel of a call by id: the admin API's (inferd call
// cancel), and another node's over /cluster/v1/, which reads it back.
type Cancelled struct {
	ID      string          `json:"id"`
	Project string          `json:"projectId"`
	State   store.CallState `json:"state"`
	Message string          `json:"message"`
}

// WriteCancelled answers a cancel of call id by id: 200 with c, 409 when it
// had finished, 404 when there is none, or what err says.
func WriteCancelled(w http.ResponseWriter, r *http.Request, log zerolog.Logger, id string, c store.Call, err error) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		Error(w, r, log, NotFound("call %s not found", Truncate(id, 64)))
	case errors.Is(err, scheduler.ErrFinished):
		Error(w, r, log, &Problem{http.StatusConflict, CodeConflict, err.Error()})
	case err != nil:
		Error(w, r, log, err)
	default:
		JSON(w, http.StatusOK, Cancelled{ID: c.ID, Project: c.ProjectID, State: c.State, Message: c.Message})
	}
}
