package admin

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/scheduler"
	"inferd/store"
)

// CallCanceller ends a call by id as scheduler.Scheduler.Cancel does: the
// call once its cancellation is durable, an error wrapping
// scheduler.ErrFinished for a finished call, store.ErrNotFound for none.
type CallCanceller func(id string) (store.Call, error)

// WithCancel serves POST /admin/calls/:id/cancel with cancel: the daemon
// passes its scheduler's Cancel, the CLI with no daemon CancelStored.
func WithCancel(cancel CallCanceller) Option {
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

// cancelCall handles POST /admin/calls/:id/cancel: 200 with the cancelled
// call, 409 when it had finished, 404 when there is none.
func (a *admin) cancelCall(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	if a.cancel == nil {
		respond.Error(w, r, a.log, &respond.Problem{Status: http.StatusNotImplemented, Code: respond.CodeInternal, Msg: "this admin API cannot cancel calls"})
		return
	}
	id := ps.ByName("id")
	c, err := a.cancel(id)
	respond.WriteCancelled(w, r, a.log, id, c, err)
}

// WithCalls serves POST /admin/projects/:id/call (inferd call) with calls,
// the operator's door onto the call path (httpapi.Server.OperatorCalls). The CLI
// with no daemon has none: the route then answers 501.
func WithCalls(calls http.Handler) Option {
	return func(a *admin) { a.calls = calls }
}

// runCall handles POST /admin/projects/:id/call with the daemon's
// operator's door (WithCalls).
func (a *admin) runCall(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	if a.calls == nil {
		respond.Error(w, r, a.log, &respond.Problem{Status: http.StatusNotImplemented, Code: respond.CodeInternal, Msg: "inferd call needs a running daemon"})
		return
	}
	a.calls.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), httprouter.ParamsKey, ps)))
}
