// Package usage is the usage ledger's report (GET /v1/usage for API keys,
// GET /admin/usage for `inferd usage`): the hourly rows of a time range
// summed by the dimensions asked for. The APIs that serve it decide which
// team's rows a caller sees (a team key its own team's projects within its
// project allowlist, an admin key every team's) and hand the report that
// as its Query's team and its keep.
package usage

import (
	"cmp"
	"math"
	"net/url"
	"slices"
	"strings"
	"time"

	"inferd/httpapi/respond"
	"inferd/store"
)

// Reader is what the usage report reads of a store.
type Reader interface {
	UsageRows(teamID string, from, to time.Time) ([]store.UsageRow, error)
}

// Bounds of a usage report.
const (
	defaultRange = 24 * time.Hour
	maxRange     = 400 * 24 * time.Hour // past any sensible usage.retention
)

// dims are the groupBy values, in the order a line's key sorts.
var dims = []string{"hour", "team", "project"}

// Query is a report's range and grouping.
type Query struct {
	From, To time.Time
	Team     string // "" = every team the caller sees
	GroupBy  []string
}

// Line is one line of a report: the dimensions it is grouped by (the
// others absent) and the sums.
type Line struct {
	Hour      *time.Time `json:"hour,omitempty"`
	TeamID    string     `json:"teamId,omitempty"`
	ProjectID string     `json:"projectId,omitempty"`
	store.UsageTotals
}

// Report is the answer of GET /v1/usage and GET /admin/usage.
type Report struct {
	From    time.Time `json:"from"`
	To      time.Time `json:"to"`
	GroupBy []string  `json:"groupBy"`
	Results []Line    `json:"results"`
	Total   Line      `json:"total"`
}

// ParseQuery reads from, to (RFC 3339 or a date; default the 24 hours
// to now), team and groupBy (team, project, hour, comma-separated; default
// project, which comes with its team).
func ParseQuery(q url.Values, now time.Time) (Query, error) {
	u := Query{To: now.UTC(), Team: q.Get("team")}
	var err error
	if s := q.Get("to"); s != "" {
		if u.To, err = parseTime("to", s); err != nil {
			return u, err
		}
	}
	u.From = u.To.Add(-defaultRange)
	if s := q.Get("from"); s != "" {
		if u.From, err = parseTime("from", s); err != nil {
			return u, err
		}
	}
	switch {
	case !u.From.Before(u.To):
		return u, respond.BadRequest("from (%s) must be before to (%s)", u.From.Format(time.RFC3339), u.To.Format(time.RFC3339))
	case u.To.Sub(u.From) > maxRange:
		return u, respond.BadRequest("from and to are more than %d days apart; ask for less at a time", int(maxRange.Hours()/24))
	}
	group := q.Get("groupBy")
	if group == "" {
		group = "project"
	}
	for _, g := range strings.Split(group, ",") {
		g = strings.TrimSpace(g)
		if !slices.Contains(dims, g) {
			return u, respond.BadRequest("groupBy %q: want team, project or hour (several separated by commas)", respond.Truncate(g, 32))
		}
		if !slices.Contains(u.GroupBy, g) {
			u.GroupBy = append(u.GroupBy, g)
		}
	}
	if slices.Contains(u.GroupBy, "project") && !slices.Contains(u.GroupBy, "team") {
		u.GroupBy = append(u.GroupBy, "team") // a project is its team's
	}
	slices.SortFunc(u.GroupBy, func(a, b string) int { return slices.Index(dims, a) - slices.Index(dims, b) })
	return u, nil
}

func parseTime(name, s string) (time.Time, error) {
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04", "2006-01-02"} {
		if t, err := time.Parse(layout, s); err == nil {
			return t.UTC(), nil
		}
	}
	return time.Time{}, respond.BadRequest("%s %q: want an RFC 3339 time (2025-01-02T15:04:05Z) or a date (2025-01-02)", name, respond.Truncate(s, 40))
}

// Build reads the rows of u and sums those keep allows by u's
// dimensions.
func Build(st Reader, u Query, keep func(store.UsageRow) bool) (Report, error) {
	rows, err := st.UsageRows(u.Team, u.From, u.To)
	if err != nil {
		return Report{}, err
	}
	rep := Report{From: u.From, To: u.To, GroupBy: u.GroupBy, Results: []Line{}}
	by := map[store.UsageKey]int{} // → index in Results
	for _, r := range rows {
		if !keep(r) {
			continue
		}
		var k store.UsageKey
		if slices.Contains(u.GroupBy, "hour") {
			k.Hour = r.Hour
		}
		if slices.Contains(u.GroupBy, "team") {
			k.TeamID = r.TeamID
		}
		if slices.Contains(u.GroupBy, "project") {
			k.ProjectID = r.ProjectID
		}
		i, ok := by[k]
		if !ok {
			i = len(rep.Results)
			by[k] = i
			line := Line{TeamID: k.TeamID, ProjectID: k.ProjectID}
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
	slices.SortFunc(rep.Results, func(a, b Line) int {
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
