package admin

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"inferd/httpapi/internal/apitest"
	"inferd/scheduler"
	"inferd/store"
)

func TestAdminSetTeamQuotaAndListWithUse(t *testing.T) {
	st, _ := newAdminEnv(t)
	h := New(st, zerolog.Nop(), WithTeamUse(func() []scheduler.TeamStatus {
		return []scheduler.TeamStatus{{ID: "acme", Replicas: 3, QueuedCalls: 7}}
	}))
	rec := apitest.Serve(h, http.MethodPut, "/admin/teams/acme", `{"quota": {"replicas": 8, "gpus": 2, "queuedBytes": 1024}}`)
	if rec.Code != http.StatusOK {
		t.Fatalf("PUT status %d: %s", rec.Code, rec.Body)
	}
	if got, _ := st.GetTeam("acme"); got.Quota != (store.Quota{Replicas: 8, GPUs: 2, QueuedBytes: 1024}) {
		t.Errorf("stored quota = %+v", got.Quota)
	}
	list := apitest.Decode[struct {
		Results []struct {
			ID    string
			Quota store.Quota
			Use   *scheduler.TeamStatus
		}
	}](t, apitest.Serve(h, http.MethodGet, "/admin/teams", ""))
	if len(list.Results) != 1 || list.Results[0].Quota.Replicas != 8 || list.Results[0].Use == nil || list.Results[0].Use.Replicas != 3 {
		t.Errorf("teams = %+v", list.Results)
	}

	// A quota below what the team's minimums hold is set, with a warning.
	echo := st.Project("echo")
	echo.MinReplicas = 2
	if _, err := st.PutProject(echo); err != nil {
		t.Fatal(err)
	}
	rec = apitest.Serve(h, http.MethodPut, "/admin/teams/acme", `{"quota": {"replicas": 1}}`)
	if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), "replicas quota of 1") {
		t.Errorf("tightening PUT = %d %s; want 200 with a warning naming the quota", rec.Code, rec.Body)
	}
	for _, bad := range []string{`{"quota": {"gpus": -1}}`, `{"quota": {"gpus": "two"}}`, `{"quota": {"lots": 1}}`} {
		if rec := apitest.Serve(h, http.MethodPut, "/admin/teams/acme", bad); rec.Code != http.StatusBadRequest {
			t.Errorf("PUT %s = %d, want 400", bad, rec.Code)
		}
	}
}

func TestAdminApplyRefusesMinimumsOverTheQuota(t *testing.T) {
	big := apitest.Project("big", "acme")
	big.MinReplicas, big.MaxReplicas = 5, 5
	capped := apitest.Project("capped", "acme")
	capped.Caps = store.ProjectCaps{MaxReplicas: 2}
	capped.MaxReplicas = 3
	for _, tc := range []struct {
		name    string
		body    string
		status  int
		mention string
	}{
		{"manifest quota", string(mustJSON(t, map[string]any{
			"teams": []store.Team{{ID: "acme", Quota: store.Quota{Replicas: 4}}}, "projects": []store.Project{big}})),
			400, "team acme's replicas quota of 4"},
		{"stored quota", applyBody(t, big), 400, "team acme's replicas quota of 3"},
		{"over its own caps", applyBody(t, capped), 400, "caps.maxReplicas of 2"},
		{"within the manifest's new quota", string(mustJSON(t, map[string]any{
			"teams": []store.Team{{ID: "acme", Quota: store.Quota{Replicas: 5}}}, "projects": []store.Project{big}})),
			200, "created"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			st, h := newAdminEnv(t)
			if _, err := st.SetTeamQuota("acme", store.Quota{Replicas: 3}); err != nil {
				t.Fatal(err)
			}
			rec := apitest.Serve(h, http.MethodPost, "/admin/apply", tc.body)
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.mention) {
				t.Fatalf("apply = %d %s; want %d mentioning %q", rec.Code, rec.Body, tc.status, tc.mention)
			}
			team, _ := st.GetTeam("acme")
			_, err := st.GetProject("big")
			if tc.status != 200 && (err == nil || team.Quota.Replicas != 3) {
				t.Errorf("a refused apply changed something: project err %v, quota %+v", err, team.Quota)
			}
			if tc.status == 200 && team.Quota.Replicas != 5 {
				t.Errorf("quota after apply = %+v, want replicas 5", team.Quota)
			}
		})
	}
}

func TestAdminCreateScopedKey(t *testing.T) {
	st, h := newAdminEnv(t)
	exp := time.Now().Add(time.Hour).UTC().Truncate(time.Second)
	rec := apitest.Serve(h, http.MethodPost, "/admin/keys", `{"team": "acme", "permissions": ["read"], "expires": "`+exp.Format(time.RFC3339)+`", "projects": ["echo"]}`)
	if rec.Code != http.StatusCreated {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	got := apitest.Decode[struct {
		Secret string
		Key    keyView
	}](t, rec)
	k, err := st.Authenticate(got.Secret)
	if err != nil || k.Allows(store.PermInfer) || !k.Expires.Equal(exp) || !k.ReachesProject("echo") || k.ReachesProject("zeta") {
		t.Errorf("stored key = %+v, %v", k, err)
	}
	if got.Key.Expires == nil || !got.Key.Expires.Equal(exp) || len(got.Key.Permissions) != 1 {
		t.Errorf("key view = %+v", got.Key)
	}
	for _, bad := range []string{
		`{"team": "acme", "permissions": ["root"]}`,
		`{"team": "acme", "expires": "2001-01-01T00:00:00Z"}`,
		`{"team": "ops", "scope": "admin", "permissions": ["read"]}`,
	} {
		if rec := apitest.Serve(h, http.MethodPost, "/admin/keys", bad); rec.Code != http.StatusBadRequest {
			t.Errorf("POST %s = %d %s, want 400", bad, rec.Code, rec.Body)
		}
	}
}
