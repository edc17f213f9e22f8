package httpapi

import (
	"testing"

	"inferd/httpapi/status"
	"inferd/scheduler"
	"inferd/store"
)

func TestStatusShowsTeamsUseAgainstQuotaToTheirOwnKeys(t *testing.T) {
	snap := scheduler.Status{Teams: []scheduler.TeamStatus{
		{ID: "acme", Quota: store.Quota{Replicas: 8}, Replicas: 3},
		{ID: "other", Quota: store.Quota{GPUs: 1}, GPUs: 1},
	}}
	env := newEnv(t, Options{Status: &status.Sources{Snapshot: func() scheduler.Status { return snap }}})
	for _, tc := range []struct {
		key  string
		want []string
	}{{keyAcme, []string{"acme"}}, {keyOther, []string{"other"}}, {keyAdmin, []string{"acme", "other"}}} {
		st := decode[status.All](t, serve(env.h, "GET", "/v1/status", "", "X-Service-API-Key", tc.key))
		var ids []string
		for _, tm := range st.Teams {
			ids = append(ids, tm.ID)
		}
		if len(ids) != len(tc.want) || ids[0] != tc.want[0] || ids[len(ids)-1] != tc.want[len(tc.want)-1] {
			t.Errorf("key %s sees teams %v, want %v", tc.key, ids, tc.want)
		}
	}
	st := decode[status.All](t, serve(env.h, "GET", "/v1/status", "", "X-Service-API-Key", keyAcme))
	if len(st.Teams) != 1 || st.Teams[0].Replicas != 3 || st.Teams[0].Quota.Replicas != 8 {
		t.Errorf("acme's team status = %+v", st.Teams)
	}
}
