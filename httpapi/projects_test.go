package httpapi

import (
	"net/http"
	"strings"
	"testing"

	"inferd/store"
)

var sixFields = []string{"id", "teamId", "minReplicas", "maxReplicas", "inferenceTimeout", "idleTimeout"}

// checkProjectJSON asserts that a project object has exactly the six API
// fields (never the model spec).
func checkProjectJSON(t *testing.T, p map[string]any) {
	t.Helper()
	if len(p) != len(sixFields) {
		t.Errorf("project has fields %v, want exactly %v", p, sixFields)
	}
	for _, f := range sixFields {
		if _, ok := p[f]; !ok {
			t.Errorf("project lacks %s: %v", f, p)
		}
	}
}

func TestListProjects(t *testing.T) {
	tests := []struct {
		name, path, header, key string
		want                    []string
	}{
		{"own team only, sorted", "/v1/projects", "X-Service-API-Key", keyAcme, []string{"echo", "zeta"}},
		{"trailing slash", "/v1/projects/", "X-Service-API-Key", keyAcme, []string{"echo", "zeta"}},
		{"other team", "/v1/projects", "X-Service-API-Key", keyOther, []string{"hidden"}},
		{"admin sees all", "/v1/projects", "X-Service-API-Key", keyAdmin, []string{"echo", "hidden", "zeta"}},
		{"banana header", "/v1/projects", "X-Banana-API-Key", keyAcme, []string{"echo", "zeta"}},
		{"lower-case header", "/v1/projects", "x-service-api-key", keyAcme, []string{"echo", "zeta"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			rec := serve(env.h, http.MethodGet, tc.path, "", tc.header, tc.key)
			if rec.Code != http.StatusOK {
				t.Fatalf("status %d: %s", rec.Code, rec.Body)
			}
			got := decode[struct{ Results []map[string]any }](t, rec)
			var ids []string
			for _, p := range got.Results {
				checkProjectJSON(t, p)
				ids = append(ids, p["id"].(string))
			}
			if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
				t.Errorf("ids %v, want %v", ids, tc.want)
			}
		})
	}
}

func TestListProjectsEmptyIsArray(t *testing.T) {
	env := newEnv(t, Options{})
	env.store.addKey(t, "ik_000000000e_lonely", "lonely", store.ScopeTeam, false)
	rec := serve(env.h, http.MethodGet, "/v1/projects", "", "X-Service-API-Key", "ik_000000000e_lonely")
	if got := strings.TrimSpace(rec.Body.String()); got != `{"results":[]}` {
		t.Errorf("body %s", got)
	}
}

func TestGetProject(t *testing.T) {
	tests := []struct {
		name, path, key string
		status          int
	}{
		{"own", "/v1/projects/echo", keyAcme, http.StatusOK},
		{"own trailing slash", "/v1/projects/echo/", keyAcme, http.StatusOK},
		{"admin any team", "/v1/projects/hidden", keyAdmin, http.StatusOK},
		{"another team's is not found", "/v1/projects/hidden", keyAcme, http.StatusNotFound},
		{"missing", "/v1/projects/nope", keyAcme, http.StatusNotFound},
		{"no key", "/v1/projects/echo", "", http.StatusUnauthorized},
		{"invalid key", "/v1/projects/echo", "ik_bad_bad", http.StatusUnauthorized},
		{"revoked key", "/v1/projects/echo", keyRevoked, http.StatusUnauthorized},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			var hdr []string
			if tc.key != "" {
				hdr = []string{"X-Service-API-Key", tc.key}
			}
			rec := serve(env.h, http.MethodGet, tc.path, "", hdr...)
			switch tc.status {
			case http.StatusOK:
				if rec.Code != http.StatusOK {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				p := decode[map[string]any](t, rec)
				checkProjectJSON(t, p)
				if p["maxReplicas"] != float64(3) || p["inferenceTimeout"] != float64(300) {
					t.Errorf("project %v", p)
				}
			case http.StatusNotFound:
				msg := apiErrorReply(t, rec, tc.status, "not_found")
				if strings.Contains(msg, "hidden") || strings.Contains(msg, "other") {
					t.Errorf("message %q reveals the project", msg)
				}
			default:
				apiErrorReply(t, rec, tc.status, "unauthorized")
			}
		})
	}
}

func TestPutProject(t *testing.T) {
	tests := []struct {
		name    string
		project string
		key     string
		body    string
		status  int
		want    map[string]float64 // the fields after the call (checked on success)
		mention string             // the error message names this
	}{
		{"partial keeps the rest", "echo", keyAcme, `{"maxReplicas": 5}`, 200,
			map[string]float64{"minReplicas": 0, "maxReplicas": 5, "inferenceTimeout": 300, "idleTimeout": 30}, ""},
		{"all four", "echo", keyAcme, `{"minReplicas": 1, "maxReplicas": 2, "inferenceTimeout": 60, "idleTimeout": 0}`, 200,
			map[string]float64{"minReplicas": 1, "maxReplicas": 2, "inferenceTimeout": 60, "idleTimeout": 0}, ""},
		{"admin any team", "hidden", keyAdmin, `{"idleTimeout": 99}`, 200,
			map[string]float64{"minReplicas": 0, "maxReplicas": 3, "inferenceTimeout": 300, "idleTimeout": 99}, ""},
		{"min above max", "echo", keyAcme, `{"minReplicas": 5, "maxReplicas": 2}`, 400, nil, "minReplicas"},
		{"min above existing max", "echo", keyAcme, `{"minReplicas": 4}`, 400, nil, "minReplicas"},
		{"out of bounds", "echo", keyAcme, `{"inferenceTimeout": 0}`, 400, nil, "inferenceTimeout"},
		{"negative", "echo", keyAcme, `{"idleTimeout": -1}`, 400, nil, "idleTimeout"},
		{"unknown attribute", "echo", keyAcme, `{"maxReplicas": 4, "gpus": 2}`, 400, nil, "gpus"},
		{"id", "echo", keyAcme, `{"id": "other"}`, 400, nil, "id"},
		{"teamId", "echo", keyAcme, `{"teamId": "other", "maxReplicas": 4}`, 400, nil, "teamId"},
		{"fraction", "echo", keyAcme, `{"maxReplicas": 1.5}`, 400, nil, "maxReplicas must be an integer"},
		{"integral float", "echo", keyAcme, `{"maxReplicas": 5.0}`, 400, nil, "maxReplicas must be an integer"},
		{"exponent", "echo", keyAcme, `{"maxReplicas": 1e1}`, 400, nil, "maxReplicas must be an integer"},
		{"string number", "echo", keyAcme, `{"maxReplicas": "3"}`, 400, nil, "maxReplicas must be an integer"},
		{"boolean", "echo", keyAcme, `{"minReplicas": true}`, 400, nil, "minReplicas must be an integer"},
		{"null", "echo", keyAcme, `{"idleTimeout": null}`, 400, nil, "idleTimeout must be an integer"},
		{"huge", "echo", keyAcme, `{"maxReplicas": 99999999999999999999999}`, 400, nil, "maxReplicas is out of range"},
		{"empty body", "echo", keyAcme, ``, 400, nil, "empty"},
		{"empty object", "echo", keyAcme, `{}`, 400, nil, "at least one"},
		{"array", "echo", keyAcme, `[{"maxReplicas": 4}]`, 400, nil, "JSON object"},
		{"malformed", "echo", keyAcme, `{"maxReplicas": 4`, 400, nil, "malformed JSON"},
		{"another team's", "hidden", keyAcme, `{"maxReplicas": 4}`, 404, nil, "not found"},
		{"missing project", "nope", keyAcme, `{"maxReplicas": 4}`, 404, nil, "not found"},
		{"no key", "echo", "", `{"maxReplicas": 4}`, 401, nil, "X-Service-API-Key"},
		{"too large", "echo", keyAcme, `{"maxReplicas": 4, "pad": "` + strings.Repeat("x", 70<<10) + `"}`, 413, nil, "larger than"},
	}
	codes := map[int]string{400: "bad_request", 401: "unauthorized", 404: "not_found", 413: "payload_too_large"}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			before := env.store.project(tc.project)
			var hdr []string
			if tc.key != "" {
				hdr = []string{"X-Service-API-Key", tc.key}
			}
			rec := serve(env.h, http.MethodPut, "/v1/projects/"+tc.project, tc.body, hdr...)
			if tc.status == http.StatusOK {
				if rec.Code != http.StatusOK {
					t.Fatalf("status %d: %s", rec.Code, rec.Body)
				}
				p := decode[map[string]any](t, rec)
				checkProjectJSON(t, p)
				for f, v := range tc.want {
					if p[f] != v {
						t.Errorf("%s = %v, want %v", f, p[f], v)
					}
				}
				// The stored project agrees with the answer.
				rec = serve(env.h, http.MethodGet, "/v1/projects/"+tc.project, "", hdr...)
				if stored := decode[map[string]any](t, rec); stored["maxReplicas"] != p["maxReplicas"] {
					t.Errorf("stored %v, answered %v", stored, p)
				}
				return
			}
			msg := apiErrorReply(t, rec, tc.status, codes[tc.status])
			if !strings.Contains(msg, tc.mention) {
				t.Errorf("message %q does not mention %q", msg, tc.mention)
			}
			after := env.store.project(tc.project)
			if after.MinReplicas != before.MinReplicas || after.MaxReplicas != before.MaxReplicas ||
				after.InferenceTimeout != before.InferenceTimeout || after.IdleTimeout != before.IdleTimeout {
				t.Errorf("project changed on error: %+v → %+v", before, after)
			}
		})
	}
}

func TestPutMinAboveMaxNamesBothValues(t *testing.T) {
	env := newEnv(t, Options{})
	rec := serve(env.h, http.MethodPut, "/v1/projects/echo", `{"minReplicas": 5, "maxReplicas": 2}`, "X-Banana-API-Key", keyAcme)
	msg := apiErrorReply(t, rec, http.StatusBadRequest, "bad_request")
	if !strings.Contains(msg, "minReplicas") || !strings.Contains(msg, "maxReplicas") || !strings.Contains(msg, "2") {
		t.Errorf("message %q", msg)
	}
}
