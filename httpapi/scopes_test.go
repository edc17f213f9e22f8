package httpapi

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

// Keys narrowed by scope, expiry and project allowlist, for the tests below.
const (
	keyReadOnly  = "ik_00000000e1_readonly"
	keyInferOnly = "ik_00000000e2_inferonly"
	keyExpired   = "ik_00000000e3_expired"
	keyZetaOnly  = "ik_00000000e4_zetaonly"
)

func newScopedEnv(t *testing.T) *testEnv {
	env := newEnv(t, Options{})
	for secret, lim := range map[string]store.KeyLimits{
		keyReadOnly:  {Permissions: []store.Permission{store.PermRead}},
		keyInferOnly: {Permissions: []store.Permission{store.PermInfer}},
		keyExpired:   {Expires: time.Now().Add(-time.Minute)},
		keyZetaOnly:  {Projects: []string{"zeta"}},
	} {
		if err := env.store.AddKey(secret, store.APIKey{TeamID: "acme", Scope: store.ScopeTeam, KeyLimits: lim}); err != nil {
			t.Fatal(err)
		}
	}
	return env
}

func TestScopedKeysOnTheProjectAPI(t *testing.T) {
	for _, tc := range []struct {
		name, method, path, key, body string
		status                        int
		mention                       string
	}{
		{"read key lists", http.MethodGet, "/v1/projects", keyReadOnly, "", 200, "echo"},
		{"read key gets", http.MethodGet, "/v1/projects/echo", keyReadOnly, "", 200, "echo"},
		{"read key may not PUT", http.MethodPut, "/v1/projects/echo", keyReadOnly, `{"maxReplicas": 2}`, 403, "may not change projects"},
		{"infer key may not list", http.MethodGet, "/v1/projects", keyInferOnly, "", 403, "may not read projects"},
		{"expired key", http.MethodGet, "/v1/projects", keyExpired, "", 401, "expired"},
		{"allowlist lists its project only", http.MethodGet, "/v1/projects", keyZetaOnly, "", 200, `"zeta"`},
		{"allowlist hides the others", http.MethodGet, "/v1/projects/echo", keyZetaOnly, "", 404, "project not found"},
		{"allowlist may not PUT the others", http.MethodPut, "/v1/projects/echo", keyZetaOnly, `{"maxReplicas": 2}`, 404, "project not found"},
		{"read key reads status", http.MethodGet, "/v1/projects/zeta", keyReadOnly, "", 200, "zeta"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newScopedEnv(t)
			rec := serve(env.h, tc.method, tc.path, tc.body, "X-Service-API-Key", tc.key)
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.mention) {
				t.Fatalf("%s %s = %d %s; want %d mentioning %q", tc.method, tc.path, rec.Code, rec.Body, tc.status, tc.mention)
			}
			if tc.name == "allowlist lists its project only" && strings.Contains(rec.Body.String(), "echo") {
				t.Errorf("a key limited to zeta listed echo: %s", rec.Body)
			}
		})
	}
	env := newScopedEnv(t)
	serve(env.h, http.MethodPut, "/v1/projects/echo", `{"maxReplicas": 2}`, "X-Service-API-Key", keyReadOnly)
	if got := env.store.project("echo").MaxReplicas; got != 3 {
		t.Errorf("a refused PUT changed maxReplicas to %d", got)
	}
}

func TestScopedKeysOnTheInferenceAPI(t *testing.T) {
	for _, tc := range []struct {
		name, path, key, modelKey string
		want                      string // message prefix
	}{
		{"read key may not start", "/start/v4", keyReadOnly, "mk-echo", "error: this key may not start or check calls"},
		{"read key may not check", "/check/v4", keyReadOnly, "", "error: this key may not start or check calls"},
		{"expired key", "/start/v4", keyExpired, "mk-echo", "error: this API key has expired"},
		{"allowlist refuses another project as unknown", "/start/v4", keyZetaOnly, "mk-echo", "error: unknown modelKey"},
		{"infer key starts", "/start/v4", keyInferOnly, "mk-echo", "queued"},
		{"allowlist starts its project", "/start/v4", keyZetaOnly, "mk-zeta", "queued"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newScopedEnv(t)
			body := `{"apiKey": "` + tc.key + `", "modelKey": "` + tc.modelKey + `", "modelInputs": {}, "startOnly": true}`
			if tc.path == "/check/v4" {
				body = `{"apiKey": "` + tc.key + `", "callID": "call_x"}`
			}
			rec := serve(env.h, http.MethodPost, tc.path, body)
			var resp struct{ Message string }
			if err := json.Unmarshal(rec.Body.Bytes(), &resp); err != nil || rec.Code != 200 {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			if !strings.HasPrefix(resp.Message, tc.want) {
				t.Errorf("message %q, want it to start with %q", resp.Message, tc.want)
			}
		})
	}
}

func TestPutProjectWithinQuotaAndCaps(t *testing.T) {
	for _, tc := range []struct {
		name    string
		quota   store.Quota
		caps    store.ProjectCaps
		body    string
		status  int
		mention string
	}{
		{"no quota: anything in bounds", store.Quota{}, store.ProjectCaps{}, `{"minReplicas": 1000, "maxReplicas": 1000}`, 200, ""},
		{"starvation refused", store.Quota{Replicas: 8}, store.ProjectCaps{}, `{"minReplicas": 1000, "maxReplicas": 1000}`, 400, "team acme's replicas quota of 8"},
		{"minimums summed over the team", store.Quota{Replicas: 4}, store.ProjectCaps{}, `{"minReplicas": 3, "maxReplicas": 4}`, 400, "sum of minReplicas"},
		{"within quota", store.Quota{Replicas: 4}, store.ProjectCaps{}, `{"minReplicas": 2, "maxReplicas": 4}`, 200, ""},
		{"cpu slots", store.Quota{CPUSlots: 1}, store.ProjectCaps{}, `{"minReplicas": 2}`, 400, "cpuSlots quota of 1"},
		{"over the admin's max cap", store.Quota{}, store.ProjectCaps{MaxReplicas: 3}, `{"maxReplicas": 4}`, 400, "admin cap caps.maxReplicas of 3"},
		{"over the admin's min cap", store.Quota{}, store.ProjectCaps{MinReplicas: 1}, `{"minReplicas": 2}`, 400, "caps.minReplicas of 1"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			zeta := env.store.project("zeta")
			zeta.MinReplicas = 2
			if _, err := env.store.PutProject(zeta); err != nil {
				t.Fatal(err)
			}
			if _, err := env.store.UpdateProject("echo", func(p *store.Project) error { p.Caps = tc.caps; return nil }); err != nil {
				t.Fatal(err)
			}
			if _, err := env.store.SetTeamQuota("acme", tc.quota); err != nil {
				t.Fatal(err)
			}
			rec := serve(env.h, http.MethodPut, "/v1/projects/echo", tc.body, "X-Service-API-Key", keyAcme)
			if rec.Code != tc.status {
				t.Fatalf("status %d, want %d: %s", rec.Code, tc.status, rec.Body)
			}
			if tc.status != 200 {
				if msg := apiErrorReply(t, rec, tc.status, codeBadRequest); !strings.Contains(msg, tc.mention) {
					t.Errorf("message %q does not name %q", msg, tc.mention)
				}
				if p := env.store.project("echo"); p.MinReplicas != 0 || p.MaxReplicas != 3 {
					t.Errorf("a refused PUT changed the project: %+v", p)
				}
			}
		})
	}
}

// TestKeyOutsideItsAllowlistLearnsNoProjectNames: a key limited to some
// projects gets, for a project of its team outside its list, exactly the
// answer it gets for a project that does not exist, on every endpoint that
// names a project (it used to get 401/403 "may not use project echo" for
// one and 404 for the other, which told it which names exist).
func TestKeyOutsideItsAllowlistLearnsNoProjectNames(t *testing.T) {
	env := newScopedEnv(t)
	// The fields that differ between any two answers (a fresh id, the time).
	volatile := regexp.MustCompile(`"(id|created)":("[^"]*"|\d+)`)
	answer := func(method, path, body string, header ...string) string {
		rec := serve(env.h, method, path, body, header...)
		return fmt.Sprintf("%d %s", rec.Code, volatile.ReplaceAllString(rec.Body.String(), ""))
	}
	hdr := []string{"X-Service-API-Key", keyZetaOnly}
	for _, tc := range []struct {
		name, method, path, body string
		header                   []string
	}{
		{"project", "GET", "/v1/projects/%s", "", hdr},
		{"update", "PUT", "/v1/projects/%s", `{"maxReplicas": 2}`, hdr},
		{"warm-up", "POST", "/v1/projects/%s/warmup", "", hdr},
		{"queue purge", "DELETE", "/v1/projects/%s/queue", "", hdr},
		{"Banana Client call", "POST", "/run/%s/", `{}`, []string{"X-Banana-API-Key", keyZetaOnly}},
		{"start by modelKey", "POST", "/start/v4", `{"apiKey": "` + keyZetaOnly + `", "modelKey": "mk-%s", "modelInputs": {}, "startOnly": true}`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			exists := answer(tc.method, strings.Replace(tc.path, "%s", "echo", 1), strings.Replace(tc.body, "%s", "echo", 1), tc.header...)
			missing := answer(tc.method, strings.Replace(tc.path, "%s", "nope", 1), strings.Replace(tc.body, "%s", "nope", 1), tc.header...)
			if exists != missing {
				t.Errorf("outside the allowlist: %s\nmissing:             %s", exists, missing)
			}
			if strings.Contains(exists, "echo") {
				t.Errorf("the answer names the project: %s", exists)
			}
		})
	}
}
