package store

import (
	"context"
	"fmt"
	"sync"
)

// hookList is a list of change hooks, safe for concurrent use.
type hookList struct {
	mu    sync.RWMutex
	hooks []func(id string)
}

func (h *hookList) add(fn func(id string)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.hooks = append(h.hooks, fn)
}

// notify runs the hooks in registration order. Callers hold no lock or
// transaction of theirs: a hook may read the store.
func (h *hookList) notify(id string) {
	h.mu.RLock()
	hooks := h.hooks
	h.mu.RUnlock()
	for _, fn := range hooks {
		fn(id)
	}
}

// ProjectHooks keeps the functions registered with OnProjectChange; an
// implementation embeds it and calls Notify after each committed project
// write. The zero value is ready to use.
type ProjectHooks struct{ list hookList }

// OnProjectChange implements Projects.
func (h *ProjectHooks) OnProjectChange(fn func(projectID string)) { h.list.add(fn) }

// Notify runs the hooks, in registration order, for a change to project
// id. Callers hold no lock or transaction of theirs: a hook may read the
// store.
func (h *ProjectHooks) Notify(id string) { h.list.notify(id) }

// TeamHooks keeps the functions registered with OnTeamChange; an
// implementation embeds it and calls NotifyTeam after each committed quota
// change. The zero value is ready to use.
type TeamHooks struct{ list hookList }

// OnTeamChange implements Teams.
func (h *TeamHooks) OnTeamChange(fn func(teamID string)) { h.list.add(fn) }

// NotifyTeam runs the hooks, in registration order, for a change to team
// id. Callers hold no lock or transaction of theirs.
func (h *TeamHooks) NotifyTeam(id string) { h.list.notify(id) }

// CallHooks keeps the functions registered with OnCallFinal (cluster
// mode's store/etcd); an implementation embeds it and calls NotifyFinal for
// each call made final. The zero value is ready to use.
type CallHooks struct{ list hookList }

// OnCallFinal registers fn to run with the id of each call made final.
func (h *CallHooks) OnCallFinal(fn func(callID string)) { h.list.add(fn) }

// NotifyFinal runs the hooks, in registration order, for call id.
func (h *CallHooks) NotifyFinal(id string) { h.list.notify(id) }

// SaveCallAndWait is SaveCall for an implementation whose writes go through
// SaveCallAsync: it queues the write and waits for its commit or for ctx to
// end (the write still happens then).
func SaveCallAndWait(ctx context.Context, s interface{ SaveCallAsync(Call, func(error)) }, c Call) error {
	ch := make(chan error, 1)
	s.SaveCallAsync(c, func(err error) { ch <- err })
	select {
	case err := <-ch:
		return err
	case <-ctx.Done():
		return fmt.Errorf("save call %s: %w", c.ID, ctx.Err())
	}
}
