package admin

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	"inferd/httpapi/internal/apitest"
	"inferd/store"
)

func newAdminEnv(t *testing.T) (*apitest.Store, http.Handler) {
	t.Helper()
	st := apitest.NewStore(t)
	st.SeedKey(t, keyAcme, "acme", store.ScopeTeam, false)
	st.SeedProject(t, apitest.Project("echo", "acme"), "mk-echo")
	return st, New(st, zerolog.Nop())
}

func TestAdminCreateKey(t *testing.T) {
	tests := []struct {
		name, body string
		status     int
		wantScope  store.KeyScope
		mention    string
	}{
		{"team key", `{"team": "acme"}`, 201, store.ScopeTeam, ""},
		{"new team admin key", `{"team": "ops", "scope": "admin"}`, 201, store.ScopeAdmin, ""},
		{"bad team id", `{"team": "Acme Corp"}`, 400, "", "team"},
		{"missing team", `{"scope": "team"}`, 400, "", "missing team"},
		{"bad scope", `{"team": "acme", "scope": "root"}`, 400, "", "scope"},
		{"wrong type", `{"team": 5}`, 400, "", "team"},
		{"empty body", ``, 400, "", "empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, h := newAdminEnv(t)
			rec := apitest.Serve(h, http.MethodPost, "/admin/keys", tc.body)
			if tc.status != http.StatusCreated {
				msg := apitest.ErrorReply(t, rec, tc.status, "bad_request")
				if !strings.Contains(msg, tc.mention) {
					t.Errorf("message %q does not mention %q", msg, tc.mention)
				}
				return
			}
			if rec.Code != http.StatusCreated {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if strings.Contains(rec.Body.String(), "hash") {
				t.Errorf("response shows the hash: %s", rec.Body)
			}
			got := apitest.Decode[struct {
				Secret string
				Key    map[string]any
			}](t, rec)
			if got.Secret == "" || got.Key["scope"] != string(tc.wantScope) || got.Key["revoked"] != nil {
				t.Errorf("got %+v", got)
			}
			if _, err := st.Authenticate(got.Secret); err != nil {
				t.Errorf("the new secret does not authenticate: %v", err)
			}
		})
	}
}

func TestAdminListAndRevokeKeys(t *testing.T) {
	st, h := newAdminEnv(t)
	st.SeedKey(t, keyOther, "other", store.ScopeTeam, false)

	rec := apitest.Serve(h, http.MethodGet, "/admin/keys?team=other", "")
	list := apitest.Decode[struct{ Results []map[string]any }](t, rec)
	if len(list.Results) != 1 || list.Results[0]["teamId"] != "other" {
		t.Fatalf("list %+v", list)
	}
	if _, ok := list.Results[0]["hash"]; ok {
		t.Error("list shows the hash")
	}
	id := list.Results[0]["id"].(string)

	rec = apitest.Serve(h, http.MethodPost, "/admin/keys/"+id+"/revoke", "")
	got := apitest.Decode[struct{ Key map[string]any }](t, rec)
	if rec.Code != http.StatusOK || got.Key["revoked"] == nil || got.Key["id"] != id {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	if _, err := st.Authenticate(keyOther); err == nil {
		t.Error("revoked key still authenticates")
	}
	// The decoded shape matches store.APIKey's field names.
	var k store.APIKey
	if err := json.Unmarshal(mustJSON(t, got.Key), &k); err != nil || !k.IsRevoked() || k.TeamID != "other" {
		t.Errorf("decode into store.APIKey: %v %+v", err, k)
	}

	apitest.ErrorReply(t, apitest.Serve(h, http.MethodPost, "/admin/keys/nope/revoke", ""), http.StatusNotFound, "not_found")

	all := apitest.Decode[struct{ Results []map[string]any }](t, apitest.Serve(h, http.MethodGet, "/admin/keys", ""))
	if len(all.Results) != 2 {
		t.Errorf("all keys %+v", all)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func applyBody(t *testing.T, projects ...store.Project) string {
	return string(mustJSON(t, map[string]any{"projects": projects}))
}

func TestAdminApply(t *testing.T) {
	echo := apitest.Project("echo", "acme")
	echo2 := echo
	echo2.MaxReplicas = 7
	fresh := apitest.Project("fresh", "newteam")
	bad := apitest.Project("broken", "acme")
	bad.Model.Protocol = "grpc"
	clash := apitest.Project("clash", "acme")
	clash.Model.KeyHash = echo.Model.KeyHash

	tests := []struct {
		name     string
		body     string
		status   int
		want     string // project:team:change,... on success
		mention  string
		unchange bool // the store must be untouched
	}{
		{"unchanged and created", applyBody(t, echo, fresh), 200, "echo:acme:unchanged,fresh:newteam:created", "", false},
		{"updated", applyBody(t, echo2), 200, "echo:acme:updated", "", false},
		{"empty list", `{"projects": []}`, 200, "", "", false},
		{"one invalid applies nothing", applyBody(t, fresh, bad), 400, "", "project broken: model.protocol", true},
		{"invalid max", applyBody(t, func() store.Project { p := fresh; p.MaxReplicas = 0; return p }()), 400, "", "maxReplicas", true},
		{"listed twice", applyBody(t, fresh, fresh), 400, "", "listed twice", true},
		{"conflict", applyBody(t, clash), 409, "", "clash", true},
		{"conflict after a valid project applies nothing", applyBody(t, fresh, clash), 409, "", "nothing was applied", true},
		{"malformed", `{"projects": [`, 400, "", "malformed JSON", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			st, h := newAdminEnv(t)
			rec := apitest.Serve(h, http.MethodPost, "/admin/apply", tc.body)
			if tc.status != http.StatusOK {
				codes := map[int]string{400: "bad_request", 409: "conflict"}
				msg := apitest.ErrorReply(t, rec, tc.status, codes[tc.status])
				if !strings.Contains(msg, tc.mention) {
					t.Errorf("message %q does not mention %q", msg, tc.mention)
				}
				if tc.unchange {
					if ps, _ := st.ListProjects(""); len(ps) != 1 || st.Project("echo").MaxReplicas != 3 {
						t.Errorf("store changed: %+v", ps)
					}
				}
				return
			}
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			got := apitest.Decode[struct{ Changes []applyChange }](t, rec)
			var parts []string
			for _, c := range got.Changes {
				parts = append(parts, c.Project+":"+c.Team+":"+c.Change)
			}
			if strings.Join(parts, ",") != tc.want {
				t.Errorf("changes %v, want %s", parts, tc.want)
			}
			if got.Changes == nil {
				t.Error("changes is null")
			}
		})
	}
}

func TestAdminApplyCreatesTeam(t *testing.T) {
	st, h := newAdminEnv(t)
	apitest.Serve(h, http.MethodPost, "/admin/apply", applyBody(t, apitest.Project("fresh", "newteam")))
	teams := apitest.Decode[struct{ Results []store.Team }](t, apitest.Serve(h, http.MethodGet, "/admin/teams", ""))
	var ids []string
	for _, tm := range teams.Results {
		ids = append(ids, tm.ID)
	}
	if strings.Join(ids, ",") != "acme,newteam" {
		t.Errorf("teams %v", ids)
	}
	if st.Project("fresh").TeamID != "newteam" {
		t.Error("project not stored")
	}
}

func TestAdminProjects(t *testing.T) {
	st, h := newAdminEnv(t)
	st.SeedProject(t, apitest.Project("alpha", "other"), "mk-alpha")

	rec := apitest.Serve(h, http.MethodGet, "/admin/projects", "")
	if strings.Contains(rec.Body.String(), "keyHash") || strings.Contains(rec.Body.String(), store.HashModelKey("mk-echo")) {
		t.Errorf("list shows the modelKey hash: %s", rec.Body)
	}
	list := apitest.Decode[struct{ Results []store.Project }](t, rec)
	if len(list.Results) != 2 || list.Results[0].ID != "alpha" || list.Results[1].Model.Command[0] != "python3" {
		t.Fatalf("list %+v", list)
	}
	team := apitest.Decode[struct{ Results []store.Project }](t, apitest.Serve(h, http.MethodGet, "/admin/projects?team=acme", ""))
	if len(team.Results) != 1 || team.Results[0].ID != "echo" {
		t.Errorf("team filter %+v", team)
	}

	rec = apitest.Serve(h, http.MethodDelete, "/admin/projects/echo", "")
	if got := apitest.Decode[struct{ Deleted string }](t, rec); rec.Code != http.StatusOK || got.Deleted != "echo" {
		t.Errorf("delete: %d %s", rec.Code, rec.Body)
	}
	apitest.ErrorReply(t, apitest.Serve(h, http.MethodDelete, "/admin/projects/echo", ""), http.StatusNotFound, "not_found")
	apitest.ErrorReply(t, apitest.Serve(h, http.MethodGet, "/admin/projects/echo", ""), http.StatusMethodNotAllowed, "method_not_allowed")
	apitest.ErrorReply(t, apitest.Serve(h, http.MethodGet, "/admin/nope", ""), http.StatusNotFound, "not_found")
}

func TestAdminApplyRefusesModelsThatCannotStartAndReportsWarnings(t *testing.T) {
	st := apitest.NewStore(t)
	check := func(m store.ModelSpec) (problems, warnings []string) {
		if m.Dir == "/nope" {
			problems = append(problems, "dir /nope does not exist: create it, or fix dir in the manifest")
		}
		if m.GPUs > 0 {
			warnings = append(warnings, "gpus: 1 per replica, but this machine has 0 GPU(s)")
		}
		return problems, warnings
	}
	h := New(st, zerolog.Nop(), WithModelCheck(check))
	broken, gpuProject := apitest.Project("broken", "acme"), apitest.Project("gpu", "acme")
	broken.Model.Dir = "/nope"
	gpuProject.Model.GPUs = 1
	rec := apitest.Serve(h, http.MethodPost, "/admin/apply", applyBody(t, gpuProject, broken))
	want := "these models cannot start on this machine (nothing was applied):\n  project broken: dir /nope does not exist: create it, or fix dir in the manifest"
	if rec.Code != http.StatusBadRequest || !strings.Contains(rec.Body.String(), strconvQuote(want)) {
		t.Fatalf("status %d: %s, want 400 %q", rec.Code, rec.Body, want)
	}
	if ps, _ := st.ListProjects(""); len(ps) != 0 {
		t.Fatalf("a refused apply stored %d projects", len(ps))
	}
	rec = apitest.Serve(h, http.MethodPost, "/admin/apply", applyBody(t, gpuProject))
	got := apitest.Decode[applyResponse](t, rec)
	if rec.Code != http.StatusOK || len(got.Warnings) != 1 || got.Warnings[0] != "project gpu: gpus: 1 per replica, but this machine has 0 GPU(s)" {
		t.Fatalf("status %d: %+v", rec.Code, got)
	}
}

// strconvQuote is s as it appears inside a JSON string.
func strconvQuote(s string) string {
	b, _ := json.Marshal(s)
	return strings.Trim(string(b), `"`)
}

func TestAdminApplyReportsCapacityWarningsOfAllProjects(t *testing.T) {
	st := apitest.NewStore(t)
	st.SeedProject(t, apitest.Project("echo", "acme"), "mk-echo")
	var seen []string
	check := func(ps []store.Project) []string {
		seen = nil
		for _, p := range ps {
			seen = append(seen, p.ID)
		}
		return []string{"minReplicas need 3 GPU replicas at once but only 2 fit"}
	}
	h := New(st, zerolog.Nop(), WithCapacityCheck(check))
	rec := apitest.Serve(h, http.MethodPost, "/admin/apply", applyBody(t, apitest.Project("fresh", "acme")))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d: %s", rec.Code, rec.Body)
	}
	got := apitest.Decode[applyResponse](t, rec)
	if len(got.Changes) != 1 || len(got.Warnings) != 1 || got.Warnings[0] != "minReplicas need 3 GPU replicas at once but only 2 fit" {
		t.Errorf("reply %+v", got)
	}
	if strings.Join(seen, ",") != "echo,fresh" {
		t.Errorf("the check saw %v, want every project after the apply", seen)
	}
	if st.Project("fresh").ID != "fresh" {
		t.Error("a warning kept the project from being stored")
	}

	// Without a check (the CLI's in-process admin), no warnings field.
	_, plain := newAdminEnv(t)
	rec = apitest.Serve(plain, http.MethodPost, "/admin/apply", applyBody(t, apitest.Project("fresh", "acme")))
	if strings.Contains(rec.Body.String(), "warnings") {
		t.Errorf("reply without a check mentions warnings: %s", rec.Body)
	}
}

// An update says what it changed and what the daemon does about it: a field
// of how replicas start rolls them, any other keeps them.
func TestAdminApplySaysWhatAnUpdateChangedAndWhatItDoes(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*store.Project)
		want   string
	}{
		{"idle timeout", func(p *store.Project) { p.IdleTimeout = 60 },
			"idleTimeout 30 -> 60: in effect now, running replicas kept"},
		{"bounds", func(p *store.Project) { p.MaxReplicas, p.MinReplicas = 5, 1 },
			"maxReplicas 3 -> 5, minReplicas 0 -> 1: in effect now, running replicas kept"},
		{"env", func(p *store.Project) { p.Model.Env = map[string]string{"A": "1"} },
			"env: replacing its replicas one by one (each new one ready before an old one stops)"},
		{"the dir's files", func(p *store.Project) { p.Model.Revision = "dir:" + strings.Repeat("a", 64) },
			"the files in dir: replacing its replicas one by one (each new one ready before an old one stops)"},
		{"a named revision", func(p *store.Project) { p.Model.Revision = "v2" },
			`revision "" -> "v2": replacing its replicas one by one (each new one ready before an old one stops)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, h := newAdminEnv(t)
			p := apitest.Project("echo", "acme")
			tc.change(&p)
			rec := apitest.Serve(h, http.MethodPost, "/admin/apply", applyBody(t, p))
			got := apitest.Decode[struct{ Changes []applyChange }](t, rec)
			if rec.Code != http.StatusOK || len(got.Changes) != 1 || got.Changes[0].Change != "updated" || got.Changes[0].Detail != tc.want {
				t.Fatalf("apply = %d %s, want updated: %s", rec.Code, rec.Body, tc.want)
			}
		})
	}
}

// A restart counts one more restart in the model spec (a change that rolls
// the replicas) and keeps everything else; an unknown project is a 404.
func TestAdminRestartProjectCountsARestart(t *testing.T) {
	st, h := newAdminEnv(t)
	before := st.Project("echo")
	for want := 1; want <= 2; want++ {
		rec := apitest.Serve(h, http.MethodPost, "/admin/projects/echo/restart", "")
		got := apitest.Decode[restartResponse](t, rec)
		if rec.Code != http.StatusOK || got.Project != "echo" || got.Restarts != want {
			t.Fatalf("restart = %d %s, want restarts %d", rec.Code, rec.Body, want)
		}
	}
	after := st.Project("echo")
	if !before.Model.RestartNeeded(after.Model) {
		t.Error("a restart left the spec as its replicas run it")
	}
	if fields := store.ChangedFields(before, after); len(fields) != 1 || fields[0] != "restarts" {
		t.Errorf("a restart changed %v, want restarts alone", fields)
	}
	apitest.ErrorReply(t, apitest.Serve(h, http.MethodPost, "/admin/projects/nope/restart", ""), http.StatusNotFound, "not_found")
}

// Keys of the tests, shaped like real ones (store.KeyIDOf).
const (
	keyAcme  = "ik_000000000a_acme"
	keyOther = "ik_000000000b_other"
)
