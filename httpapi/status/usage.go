package status

import (
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/pipeline"
	"inferd/store"
)

// Usage is GET /v1/status/usage: the status page's usage panel, the
// last 24 hours of the usage ledger by team (the caller's team for a team
// key, within its project allowlist), with each hour's replica-seconds per
// team for the chart.
type Usage struct {
	From  time.Time   `json:"from"`
	To    time.Time   `json:"to"`
	Teams []UsageTeam `json:"teams"` // sorted by id
	Hours []UsageHour `json:"hours"` // every hour of the range, oldest first
}

type UsageTeam struct {
	TeamID string `json:"teamId"`
	store.UsageTotals
}

// UsageHour is one hour's replica-seconds by team, split into the
// calls' shares, boot and idle time.
type UsageHour struct {
	Hour  time.Time                    `json:"hour"`
	Teams map[string]replicaTimeSplits `json:"teams"`
}

type replicaTimeSplits struct {
	Calls float64 `json:"calls"`
	Boot  float64 `json:"boot"`
	Idle  float64 `json:"idle"`
}

// usagePanelHours is how far back the usage panel looks.
const usagePanelHours = 24

// usage handles GET /v1/status/usage.
func (s *api) usage(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, err := s.key(r)
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	to := store.UsageHour(s.now()).Add(time.Hour) // the hour under way included
	from := to.Add(-usagePanelHours * time.Hour)
	team := key.TeamID
	if key.Scope == store.ScopeAdmin {
		team = ""
	}
	rows, err := s.store.UsageRows(team, from, to)
	if err != nil {
		respond.Error(w, r, s.log, err)
		return
	}
	out := Usage{From: from, To: to, Teams: []UsageTeam{}, Hours: make([]UsageHour, 0, usagePanelHours)}
	for h := from; h.Before(to); h = h.Add(time.Hour) {
		out.Hours = append(out.Hours, UsageHour{Hour: h, Teams: map[string]replicaTimeSplits{}})
	}
	teams := map[string]*UsageTeam{}
	for _, row := range rows {
		if !pipeline.Reaches(key, row.TeamID, row.ProjectID) {
			continue
		}
		t := teams[row.TeamID]
		if t == nil {
			t = &UsageTeam{TeamID: row.TeamID}
			teams[row.TeamID] = t
		}
		t.Add(row.UsageTotals)
		if i := int(row.Hour.Sub(from) / time.Hour); i >= 0 && i < len(out.Hours) {
			split := out.Hours[i].Teams[row.TeamID]
			split.Calls += row.ReplicaSeconds
			split.Boot += row.BootReplicaSeconds
			split.Idle += row.IdleReplicaSeconds
			out.Hours[i].Teams[row.TeamID] = split
		}
	}
	for _, t := range teams {
		out.Teams = append(out.Teams, *t)
	}
	slices.SortFunc(out.Teams, func(a, b UsageTeam) int { return strings.Compare(a.TeamID, b.TeamID) })
	respond.JSON(w, http.StatusOK, out)
}
