package batches

import "slices"

// Access is whose files and batches a request reaches: its key's team's,
// within the key's project allowlist (Projects; empty: all of the team's),
// or, for an admin key, every team's. Anything outside it answers
// ErrNotFound, as what does not exist does, so a key learns no ids (and,
// through a file's lines, no project names) it may not use.
type Access struct {
	Team     string
	Projects []string
	Admin    bool
}

// Team is the access of a key of team that reaches all of its projects.
func Team(team string) Access { return Access{Team: team} }

// limited reports whether the key is held to some of its team's projects.
func (a Access) limited() bool { return len(a.Projects) > 0 }

// reachesFile reports whether a may use file r: a file concerns the
// projects its uploader's key reached (r.Projects; empty: any of its
// team's), an output file its batch's project, and a key limited to some
// projects reaches only files that concern none but those.
func (a Access) reachesFile(r fileRecord) bool {
	switch {
	case a.Admin:
		return true
	case r.Team != a.Team:
		return false
	case !a.limited():
		return true
	}
	return len(r.Projects) > 0 && !slices.ContainsFunc(r.Projects, func(p string) bool { return !slices.Contains(a.Projects, p) })
}

// reachesBatch reports whether a may see and cancel batch b: its team's,
// and its project within a's allowlist.
func (a Access) reachesBatch(b *batchRecord) bool {
	return a.Admin || b.Team == a.Team && (!a.limited() || slices.Contains(a.Projects, b.Project))
}
