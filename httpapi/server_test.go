package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

func TestRouting(t *testing.T) {
	tests := []struct {
		name, method, path string
		status             int
		code               string
		allow              string
	}{
		{"unknown path", http.MethodGet, "/nope", 404, "not_found", ""},
		{"unknown version", http.MethodPost, "/start/v9", 404, "not_found", ""},
		{"project sub-path", http.MethodGet, "/v1/projects/echo/replicas", 404, "not_found", ""},
		{"wrong method on project", http.MethodDelete, "/v1/projects/echo", 405, "method_not_allowed", "GET, OPTIONS, PUT"},
		{"wrong method on list", http.MethodPost, "/v1/projects", 405, "method_not_allowed", "GET, OPTIONS"},
		{"GET on start", http.MethodGet, "/start/v4", 405, "method_not_allowed", "OPTIONS, POST"},
		{"GET on check with slash", http.MethodGet, "/check/v4/", 405, "method_not_allowed", "OPTIONS, POST"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			rec := serve(env.h, tc.method, tc.path, "", "X-Service-API-Key", keyAcme)
			apiErrorReply(t, rec, tc.status, tc.code)
			if got := rec.Header().Get("Allow"); got != tc.allow {
				t.Errorf("Allow %q, want %q", got, tc.allow)
			}
			if loc := rec.Header().Get("Location"); loc != "" {
				t.Errorf("redirect to %s", loc)
			}
		})
	}
}

func TestOptionsListsMethods(t *testing.T) {
	env := newEnv(t, Options{})
	rec := serve(env.h, http.MethodOptions, "/v1/projects/echo", "")
	if rec.Code != http.StatusNoContent || rec.Header().Get("Allow") != "GET, OPTIONS, PUT" {
		t.Errorf("status %d Allow %q", rec.Code, rec.Header().Get("Allow"))
	}
}

func TestHealth(t *testing.T) {
	tests := []struct {
		name     string
		path     string
		notReady bool
		status   int
		want     string
	}{
		{"healthz", "/healthz", false, 200, "ok"},
		{"healthz while not ready", "/healthz", true, 200, "ok"},
		{"ready", "/readyz", false, 200, "ready"},
		{"not ready", "/readyz", true, 503, "not ready"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			env.sched.notReady = tc.notReady
			rec := serve(env.h, http.MethodGet, tc.path, "")
			got := decode[struct{ Status string }](t, rec)
			if rec.Code != tc.status || got.Status != tc.want {
				t.Errorf("status %d %q, want %d %q", rec.Code, got.Status, tc.status, tc.want)
			}
		})
	}
}

func TestRequestID(t *testing.T) {
	tests := []struct {
		name, incoming string
		kept           bool
	}{
		{"none", "", false},
		{"sane", "req-1.A_b", true},
		{"64 chars", strings.Repeat("a", 64), true},
		{"too long", strings.Repeat("a", 65), false},
		{"forged log line", "x\" injected=\"1", false},
		{"spaces", "a b", false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			rec := serve(env.h, http.MethodGet, "/healthz", "", "X-Request-Id", tc.incoming)
			got := rec.Header().Get("X-Request-Id")
			if tc.kept && got != tc.incoming {
				t.Errorf("X-Request-Id %q, want %q", got, tc.incoming)
			}
			if !tc.kept && (got == tc.incoming || len(got) != 36) {
				t.Errorf("X-Request-Id %q, want a fresh UUID", got)
			}
		})
	}
}

func TestAccessLogLine(t *testing.T) {
	env := newEnv(t, Options{})
	body := `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "startOnly": true, "modelInputs": {"secret-input": 1}}`
	rec := serve(env.h, http.MethodPost, "/start/v4", body, "X-Request-Id", "r-42", "X-Service-API-Key", keyOther)
	logs := strings.TrimSpace(env.logs())
	if strings.Count(logs, "\n") != 0 {
		t.Fatalf("want one log line, got:\n%s", logs)
	}
	var line map[string]any
	if err := json.Unmarshal([]byte(logs), &line); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"method": "POST", "path": "/start/v4", "status": float64(200),
		"request_id": "r-42", "bytes": float64(rec.Body.Len())}
	for k, v := range want {
		if line[k] != v {
			t.Errorf("%s = %v, want %v", k, line[k], v)
		}
	}
	if _, ok := line["duration_ms"].(float64); !ok {
		t.Errorf("duration_ms = %v", line["duration_ms"])
	}
	for _, secret := range []string{keyAcme, keyOther, "mk-echo", "secret-input"} {
		if strings.Contains(logs, secret) {
			t.Errorf("log contains %q", secret)
		}
	}
}

func TestProjectPanicAnswersJSON500(t *testing.T) {
	env := newEnv(t, Options{})
	env.store.authPanic = true
	rec := serve(env.h, http.MethodGet, "/v1/projects", "", "X-Service-API-Key", keyAcme)
	msg := apiErrorReply(t, rec, http.StatusInternalServerError, "internal")
	if !strings.Contains(msg, rec.Header().Get("X-Request-Id")) {
		t.Errorf("message %q lacks the request id", msg)
	}
}
