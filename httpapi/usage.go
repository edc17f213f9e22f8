package httpapi

import (
	"cmp"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/store"
)

// The usage ledger's report (GET /v1/usage for API keys, GET /admin/usage
// for `inferd usage`): the hourly rows of a time range summed by the
// dimensions asked for. A team key sees its own team's projects (within
// its project allowlist), an admin key every team's.

// UsageReader is what the usage report reads of a store.
type UsageReader interface {
	UsageRows(teamID string, from, to time.Time) ([]store.UsageRow, error)
}

// Bounds of a usage report.
const (
	defaultUsageRange = 24 * time.Hour
	maxUsageRange     = 400 * 24 * time.Hour // past any sensible usage.retention
)

// usageDims are the groupBy values, in the order a line's key sorts.
var usageDims = []string{"hour", "team", "project"}

// usageQuery is a report's range and grouping.
type usageQuery struct {
	from, to time.Time
	team     string // "" = every team the key sees
	groupBy  []string
}

// usageLine is one line of a report: the dimensions it is grouped by (the
// others absent) and the sums.
type usageLine struct {
	Hour      *time.Time `json:"hour,omitempty"`
	TeamID    string     `json:"teamId,omitempty"`
	ProjectID string     `json:"projectId,omitempty"`
	store.UsageTotals
}

// UsageReport is the answer of GET /v1/usage and GET /admin/usage.
type UsageReport struct {
	From    time.Time   `json:"from"`
	To      time.Time   `json:"to"`
	GroupBy []string    `json:"groupBy"`
	Results []usageLine `json:"results"`
	Total   usageLine   `json:"total"`
}

// parseUsageQuery reads from, to (RFC 3339 or a date; default the 24 hours
// to now), team and groupBy (team, project, hour, comma-separated; default
// project, which comes with its team).
func parseUsageQuery(q url.Values, now time.Time) (usageQuery, error) {
	u := usageQuery{to: now.UTC(), team: q.Get("team")}
	var err error
	if s := q.Get("to"); s != "" {
		if u.to, err = parseUsageTime("to", s); err != nil {
			return u, err
		}
	}
	u.from = u.to.Add(-defaultUsageRange)
	if s := q.Get("from"); s != "" {
		if u.from, err = parseUsageTime("from", s); err != nil {
			return u, err
		}
	}
	switch {
	case !u.from.Before(u.to):
		return u, badRequest("from (%s) must be before to (%s)", u.from.Format(time.RFC3339), u.to.Format(time.RFC3339))
	case u.to.Sub(u.from) > maxUsageRange:
		return u, badRequest("from and to are more than %d days apart; ask for less at a time", int(maxUsageRange.Hours()/24))
	}
	group := q.Get("groupBy")
	if group == "" {
		group = "project"
	}
	for _, g := range strings.Split(group, ",") {
		g = strings.TrimSpace(g)
		if !slices.Contains(usageDims, g) {
			return u, badRequest("groupBy %q: want team, project or hour (several separated by commas)", truncate(g, 32))
		}
		if !slices.Contains(u.groupBy, g) {
			u.groupBy = append(u.groupBy, g)
		}
	}
	if slices.Contains(u.groupBy, "project") && !slices.Contains(u.groupBy, "team") {
		u.groupBy = append(u.groupBy, "team") // a project is its team's
	}
	slices.SortFunc(u.groupBy, func(a, b string) int { return slices.Index(usageDims, a) - slices.Index(usageDims, b) })
	return u, nil
}

func parseUsageTime(name, s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, badRequest("%s %q: want an RFC 3339 time (2025-01-02T15:04:05Z) or a date (2025-01-02)", name, truncate(s, 40))
}

// usageReport reads the rows of u and sums those keep allows by u's
// dimensions.
func usageReport(st UsageReader, u usageQuery, keep func(store.UsageRow) bool) (UsageReport, error) {
	rows, err := st.UsageRows(u.team, u.from, u.to)
	if err != nil {
		return UsageReport{}, err
	}
	rep := UsageReport{From: u.from, To: u.to, GroupBy: u.groupBy, Results: []usageLine{}}
	by := map[store.UsageKey]int{} // → index in Results
	for _, r := range rows {
		if !keep(r) {
			continue
		}
		var k store.UsageKey
		if slices.Contains(u.groupBy, "hour") {
			k.Hour = r.Hour
		}
		if slices.Contains(u.groupBy, "team") {
			k.TeamID = r.TeamID
		}
		if slices.Contains(u.groupBy, "project") {
			k.ProjectID = r.ProjectID
		}
		i, ok := by[k]
		if !ok {
			i = len(rep.Results)
			by[k] = i
			line := usageLine{TeamID: k.TeamID, ProjectID: k.ProjectID}
			if !k.Hour.IsZero() {
				h := k.Hour
				line.Hour = &h
			}
			rep.Results = append(rep.Results, line)
		}
		rep.Results[i].UsageTotals.Add(r.UsageTotals)
		rep.Total.UsageTotals.Add(r.UsageTotals)
	}
	for i := range rep.Results {
		roundTotals(&rep.Results[i].UsageTotals)
	}
	roundTotals(&rep.Total.UsageTotals)
	slices.SortFunc(rep.Results, func(a, b usageLine) int {
		var ha, hb time.Time
		if a.Hour != nil {
			ha = *a.Hour
		}
		if b.Hour != nil {
			hb = *b.Hour
		}
		return cmp.Or(ha.Compare(hb), strings.Compare(a.TeamID, b.TeamID), strings.Compare(a.ProjectID, b.ProjectID))
	})
	return rep, nil
}

// usage handles GET /v1/usage: the caller's team's usage (every team's for
// an admin key), within its project allowlist.
func (a *api) usage(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, err := a.headerKey(r)
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	u, err := parseUsageQuery(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	if key.Scope != store.ScopeAdmin {
		if u.team != "" && u.team != key.TeamID {
			writeError(w, r, a.log, notFound("team not found"))
			return
		}
		u.team = key.TeamID // the store reads this team's rows only
	}
	rep, err := usageReport(a.store, u, func(row store.UsageRow) bool { return key.ReachesProject(row.ProjectID) })
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// usage handles GET /admin/usage: every team's usage, as GET /v1/usage
// answers an admin key.
func (a *admin) usage(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	u, err := parseUsageQuery(r.URL.Query(), time.Now())
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	rep, err := usageReport(a.store, u, func(store.UsageRow) bool { return true })
	if err != nil {
		writeError(w, r, a.log, err)
		return
	}
	writeJSON(w, http.StatusOK, rep)
}

// roundTotals rounds the seconds and joules of a report line to thousandths,
// as inferd usage prints them: sums of float64 shares carry binary noise
// (0.9540000000000002) that says nothing.
func roundTotals(t *store.UsageTotals) {
	for _, v := range []*float64{&t.QueueSeconds, &t.BootWaitSeconds, &t.RunSeconds, &t.ReplicaSeconds, &t.GPUSeconds,
		t.CPUSeconds, t.EnergyJoules, &t.BootReplicaSeconds, &t.IdleReplicaSeconds, &t.BootGPUSeconds, &t.IdleGPUSeconds} {
		if v != nil {
			*v = math.Round(*v*1000) / 1000
		}
	}
}
