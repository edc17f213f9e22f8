package status

import (
	"inferd/pipeline"
	"inferd/store"
)

// liveCalls are the calls the scheduler holds live that key may see, newest
// first, as the calls list shows them: a sync start is written only when it
// ends (or outlasts its wait), so until then the scheduler alone knows it.
// team is the key's team, "" for an admin key, as for the stored calls.
func (s *api) liveCalls(key store.APIKey, team string) []store.Call {
	if s.src.Live == nil {
		return nil
	}
	var out []store.Call
	for _, c := range s.src.Live(team, maxStatusCalls) {
		if !pipeline.Reaches(key, c.TeamID, c.ProjectID) {
			continue
		}
		out = append(out, store.Call{
			ID: c.ID, ProjectID: c.ProjectID, TeamID: c.TeamID, State: c.State,
			Priority: c.Priority, Attempt: c.Attempt, Created: c.Created,
			Dispatched: c.Dispatched, ReplicaID: c.ReplicaID, QueueMs: c.QueueMs, BootMs: c.BootMs,
		})
	}
	return out
}

// mergeLive lists live and stored calls (each newest first, by id, as the
// store lists them) as one list, newest first, one entry per call. A live
// entry wins over the stored record of its call, which is older (a sync
// start that outlasted its wait was written queued, and runs now), unless
// that record is final: the call finished after the live calls were read.
// The live calls are read before the store for that reason: a call that
// leaves the scheduler has committed its final write first, so it is in
// one list or the other, never in neither.
func mergeLive(live, stored []store.Call) []store.Call {
	if len(live) == 0 {
		return stored
	}
	isLive := make(map[string]bool, len(live))
	for _, c := range live {
		isLive[c.ID] = true
	}
	final := map[string]bool{} // live calls the store holds finished
	for _, c := range stored {
		if isLive[c.ID] && c.State.Done() {
			final[c.ID] = true
		}
	}
	out := make([]store.Call, 0, len(live)+len(stored))
	for i, j := 0, 0; i < len(live) || j < len(stored); {
		switch {
		case i < len(live) && final[live[i].ID]:
			i++
		case j < len(stored) && isLive[stored[j].ID] && !final[stored[j].ID]:
			j++
		case j == len(stored) || (i < len(live) && live[i].ID > stored[j].ID):
			out = append(out, live[i])
			i++
		default:
			out = append(out, stored[j])
			j++
		}
	}
	return out
}
