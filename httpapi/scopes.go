package httpapi

import (
	"fmt"
	"net/http"

	"inferd/store"
)

// Key scopes (DESIGN.md "Tenancy"): a team key holds some of infer (start,
// check), read (GET projects, status) and manage (PUT projects), may expire,
// and may be limited to some of its team's projects. An admin key holds
// everything.

// errKeyExpired answers a key past its expiry, on every endpoint.
var errKeyExpired = &userError{http.StatusUnauthorized, codeUnauthorized, "this API key has expired"}

// actions say, per permission, what a key lacking it may not do.
var actions = map[store.Permission]string{
	store.PermInfer:  "start or check calls",
	store.PermRead:   "read projects or status",
	store.PermManage: "change projects",
}

// requirePermission fails with a 403 naming what the key may not do.
func requirePermission(key store.APIKey, p store.Permission) error {
	if key.Allows(p) {
		return nil
	}
	return &userError{http.StatusForbidden, codeForbidden,
		fmt.Sprintf("this key may not %s (its scope is %s; %s is needed)", actions[p], key.ScopeText(), p)}
}

// mayReach reports whether key may see project projectID of teamID: its
// team's (or any, for an admin key) and within its project allowlist. A
// project it may not reach answers everywhere as one that does not exist,
// so that a narrowed key learns no names.
func mayReach(key store.APIKey, teamID, projectID string) bool {
	return mayAccess(key, teamID) && key.ReachesProject(projectID)
}

// reachesOf is mayReach for one key, as store.Wait.Shown asks it: a
// waitingFor names other projects only to a key that may reach them all.
func reachesOf(key store.APIKey) func(teamID, projectID string) bool {
	return func(teamID, projectID string) bool { return mayReach(key, teamID, projectID) }
}

// reachesNone names no project: for what leaves without a key's request
// (a webhook's body).
func reachesNone(string, string) bool { return false }
