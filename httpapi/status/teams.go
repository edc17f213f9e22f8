package status

import (
	"slices"

	"inferd/scheduler"
	"inferd/store"
)

// viewTeams is the teams a status request may see, with their use against
// their quotas: every team for an admin key, the key's own for a team key.
// Never nil.
func viewTeams(v view) []scheduler.TeamStatus {
	out := slices.Clone(v.snapshot.Teams)
	out = slices.DeleteFunc(out, func(t scheduler.TeamStatus) bool {
		return v.key.Scope != store.ScopeAdmin && t.ID != v.key.TeamID
	})
	if out == nil {
		out = []scheduler.TeamStatus{}
	}
	return out
}
