package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"
	"github.com/rs/zerolog"

	"inferd/scheduler"
	"inferd/store"
)

// CallCanceller ends a call by id as scheduler.Scheduler.Cancel does: the
// call once its cancellation is durable, an error wrapping
// scheduler.ErrFinished for a finished call, store.ErrNotFound for none.
type CallCanceller func(id string) (store.Call, error)

// WithCancel serves POST /admin/calls/:id/cancel with cancel: the daemon
// passes its scheduler's Cancel, the CLI with no daemon CancelStored.
func WithCancel(cancel CallCanceller) AdminOption {
	return func(a *admin) { a.cancel = cancel }
}

// CallStore is what CancelStored needs of a store.
type CallStore interface {
	GetCall(id string) (store.Call, error)
	SaveCall(ctx context.Context, c store.Call) error
}

// CancelStored cancels calls in a store that no scheduler serves (no daemon
// runs, so nothing else writes them): a pending call is written as a cancel
// leaves it (scheduler.Cancelled), and the next daemon finds it finished.
func CancelStored(st CallStore) CallCanceller {
	return func(id string) (store.Call, error) {
		c, err := st.GetCall(id)
		if err != nil {
			return store.Call{}, err
		}
		if c.State.Done() {
			return c, scheduler.FinishedError(c)
		}
		c = scheduler.Cancelled(c, time.Now())
		if err := st.SaveCall(context.Background(), c); err != nil {
			return store.Call{}, fmt.Errorf("cancel call %s: %w", id, err)
		}
		return c, nil
	}
}

// cancelledCall answers POST /admin/calls/:id/cancel.
type cancelledCall struct {
	ID      string          `json:"id"`
	Project string          `json:"projectId"`
	State   store.CallState `json:"state"`
	Message string          `json:"message"`
}

// cancelCall handles POST /admin/calls/:id/cancel: 200 with the cancelled
// call, 409 when it had finished, 404 when there is none.
func (a *admin) cancelCall(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	if a.cancel == nil {
		writeError(w, r, a.log, &userError{http.StatusNotImplemented, codeInternal, "this admin API cannot cancel calls"})
		return
	}
	id := ps.ByName("id")
	c, err := a.cancel(id)
	writeCancelled(w, r, a.log, id, c, err)
}

// writeCancelled answers a cancel of call id by id (the admin API's, and
// another node's over /cluster/v1/): c, or what err says.
func writeCancelled(w http.ResponseWriter, r *http.Request, log zerolog.Logger, id string, c store.Call, err error) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, r, log, notFound("call %s not found", truncate(id, 64)))
	case errors.Is(err, scheduler.ErrFinished):
		writeError(w, r, log, &userError{http.StatusConflict, codeConflict, err.Error()})
	case err != nil:
		writeError(w, r, log, err)
	default:
		writeJSON(w, http.StatusOK, cancelledCall{ID: c.ID, Project: c.ProjectID, State: c.State, Message: c.Message})
	}
}

// WithCalls serves POST /admin/projects/:id/call (inferd call) with calls,
// the operator's door onto the call path (Server.OperatorCalls). The CLI
// with no daemon has none: the route then answers 501.
func WithCalls(calls http.Handler) AdminOption {
	return func(a *admin) { a.calls = calls }
}

// runCall handles POST /admin/projects/:id/call with the daemon's
// operator's door (WithCalls).
func (a *admin) runCall(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	if a.calls == nil {
		writeError(w, r, a.log, &userError{http.StatusNotImplemented, codeInternal, "inferd call needs a running daemon"})
		return
	}
	a.calls.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httprouter.ParamsKey, ps)))
}
