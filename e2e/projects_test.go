package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"
)

// projectsManifest declares two teams' projects; none of them boots a replica
// (minReplicas 0), so these tests exercise the store and the API alone.
func projectsManifest(dir string) string {
	return fmt.Sprintf(`projects:
  - id: alpha
    team: acme
    modelKey: mk-alpha
    command: ["python3", "server.py"]
    dir: %[1]s
  - id: beta
    team: acme
    modelKey: mk-beta
    command: ["python3", "server.py"]
    dir: %[1]s
    maxReplicas: 5
    idleTimeout: 60
  - id: gamma
    team: globex
    modelKey: mk-gamma
    command: ["python3", "server.py"]
    dir: %[1]s
`, dir)
}

func TestProjectAPIEndToEnd(t *testing.T) {
	t.Parallel()
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)

	// Keys and projects are created with the CLI while the daemon runs.
	acme := d.createKey("acme", false)
	globex := d.createKey("globex", false)
	admin := d.createKey("ops", true)
	out := d.apply(projectsManifest(echoDir(t)))
	for _, want := range []string{"project alpha (team acme): created", "project gamma (team globex): created"} {
		if !strings.Contains(out, want) {
			t.Fatalf("apply output %q lacks %q", out, want)
		}
	}
	if out := d.apply(projectsManifest(echoDir(t))); !strings.Contains(out, "project alpha (team acme): unchanged") {
		t.Fatalf("re-applying the same manifest should change nothing, got %q", out)
	}

	key := func(k string) map[string]string { return map[string]string{"X-Service-API-Key": k} }
	url := d.base + "/v1/projects"

	t.Run("list shows only the caller's projects, sorted, with six fields", func(t *testing.T) {
		status, body := do(t, "GET", url, key(acme), "")
		if status != 200 {
			t.Fatalf("status %d: %v", status, body)
		}
		results := body["results"].([]any)
		if len(results) != 2 || results[0].(map[string]any)["id"] != "alpha" || results[1].(map[string]any)["id"] != "beta" {
			t.Fatalf("acme sees %v", results)
		}
		p := results[1].(map[string]any)
		want := map[string]any{"id": "beta", "teamId": "acme", "minReplicas": 0.0, "maxReplicas": 5.0, "inferenceTimeout": 300.0, "idleTimeout": 60.0}
		if len(p) != len(want) {
			t.Fatalf("project has fields %v, want exactly %v", p, want)
		}
		for k, v := range want {
			if p[k] != v {
				t.Fatalf("field %s = %v, want %v", k, p[k], v)
			}
		}
	})
	t.Run("admin key lists every team", func(t *testing.T) {
		_, body := do(t, "GET", url, key(admin), "")
		if n := len(body["results"].([]any)); n != 3 {
			t.Fatalf("admin sees %d projects, want 3", n)
		}
	})
	t.Run("the original Banana header works", func(t *testing.T) {
		status, body := do(t, "GET", url+"/alpha", map[string]string{"x-banana-api-key": acme}, "")
		if status != 200 || body["id"] != "alpha" {
			t.Fatalf("status %d body %v", status, body)
		}
	})

	tests := []struct {
		name       string
		method     string
		path       string
		key        string
		body       string
		wantStatus int
		wantInMsg  string
	}{
		{"another team's project is not found", "GET", "/gamma", acme, "", 404, ""},
		{"another team cannot update it either", "PUT", "/gamma", acme, `{"minReplicas":1}`, 404, ""},
		{"unknown project", "GET", "/nope", acme, "", 404, ""},
		{"missing key", "GET", "", "", "", 401, ""},
		{"invalid key", "GET", "", "ik_0000000000_nope", "", 401, ""},
		{"min above max is refused", "PUT", "/alpha", acme, `{"minReplicas": 5, "maxReplicas": 2}`, 400, "minReplicas"},
		{"empty body", "PUT", "/alpha", acme, ``, 400, ""},
		{"empty object", "PUT", "/alpha", acme, `{}`, 400, ""},
		{"unknown attribute", "PUT", "/alpha", acme, `{"replicas": 2}`, 400, "replicas"},
		{"id is not updatable", "PUT", "/alpha", acme, `{"id": "x"}`, 400, "id"},
		{"teamId is not updatable", "PUT", "/alpha", acme, `{"teamId": "globex"}`, 400, "teamId"},
		{"fraction", "PUT", "/alpha", acme, `{"maxReplicas": 1.5}`, 400, "maxReplicas"},
		{"string number", "PUT", "/alpha", acme, `{"maxReplicas": "3"}`, 400, "maxReplicas"},
		{"negative", "PUT", "/alpha", acme, `{"idleTimeout": -1}`, 400, "idleTimeout"},
		{"out of bounds", "PUT", "/alpha", acme, `{"inferenceTimeout": 0}`, 400, "inferenceTimeout"},
		{"max zero", "PUT", "/alpha", acme, `{"maxReplicas": 0}`, 400, "maxReplicas"},
		{"malformed JSON", "PUT", "/alpha", acme, `{"maxReplicas":`, 400, ""},
		{"wrong method", "DELETE", "/alpha", acme, ``, 405, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := map[string]string{}
			if tc.key != "" {
				h = key(tc.key)
			}
			status, body := do(t, tc.method, url+tc.path, h, tc.body)
			if status != tc.wantStatus {
				t.Fatalf("status %d, want %d: %v", status, tc.wantStatus, body)
			}
			e, ok := body["error"].(map[string]any)
			if !ok || e["code"] == "" || e["message"] == "" {
				t.Fatalf("error body must be {error:{code,message}}, got %v", body)
			}
			if !strings.Contains(e["message"].(string), tc.wantInMsg) {
				t.Fatalf("message %q should mention %q", e["message"], tc.wantInMsg)
			}
		})
	}

	t.Run("refused updates changed nothing", func(t *testing.T) {
		_, body := do(t, "GET", url+"/alpha", key(acme), "")
		if body["minReplicas"] != 0.0 || body["maxReplicas"] != 3.0 || body["inferenceTimeout"] != 300.0 || body["idleTimeout"] != 30.0 {
			t.Fatalf("alpha changed: %v", body)
		}
	})
	t.Run("partial PUT keeps the other fields", func(t *testing.T) {
		status, body := do(t, "PUT", url+"/beta", key(acme), `{"maxReplicas": 7}`)
		if status != 200 || body["maxReplicas"] != 7.0 || body["idleTimeout"] != 60.0 || body["minReplicas"] != 0.0 {
			t.Fatalf("status %d body %v", status, body)
		}
		_, body = do(t, "GET", url+"/beta", key(acme), "")
		if body["maxReplicas"] != 7.0 {
			t.Fatalf("update not persisted: %v", body)
		}
	})

	// Restart: teams, keys and projects survive.
	d.stop()
	d = startDaemon(t, dir, cfg)
	status, body := do(t, "GET", d.base+"/v1/projects/beta", key(acme), "")
	if status != 200 || body["maxReplicas"] != 7.0 {
		t.Fatalf("after restart: status %d body %v", status, body)
	}

	// A revoked key stops working at once.
	list, err := d.cli("key", "list", "--team", "globex")
	if err != nil {
		t.Fatal(err)
	}
	keyID := strings.Fields(strings.Split(strings.TrimSpace(list), "\n")[1])[0]
	if status, _ := do(t, "GET", d.base+"/v1/projects", key(globex), ""); status != 200 {
		t.Fatalf("globex key should work before revocation, got %d", status)
	}
	if _, err := d.cli("key", "revoke", keyID); err != nil {
		t.Fatal(err)
	}
	if status, _ := do(t, "GET", d.base+"/v1/projects", key(globex), ""); status != http.StatusUnauthorized {
		t.Fatalf("revoked key answered %d, want 401", status)
	}
	if out, _ := d.cli("key", "list", "--team", "globex"); !strings.Contains(out, "revoked") {
		t.Fatalf("key list should show the key revoked: %q", out)
	}
}

func TestCLIWorksWithoutDaemon(t *testing.T) {
	t.Parallel()
	dir, cfg := newDaemonDir(t, "")
	out, err := runCLI(cfg, "key", "create", "--team", "solo")
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimSpace(out[strings.LastIndex(strings.TrimSpace(out), "\n")+1:])
	if !strings.HasPrefix(secret, "ik_") {
		t.Fatalf("last line should be the secret, got %q", secret)
	}
	// The daemon started afterwards accepts the key made offline.
	d := startDaemon(t, dir, cfg)
	if status, body := do(t, "GET", d.base+"/v1/projects", map[string]string{"X-Service-API-Key": secret}, ""); status != 200 {
		t.Fatalf("status %d: %v", status, body)
	}
}

func TestBadConfigStopsStartupNamingTheKey(t *testing.T) {
	t.Parallel()
	_, cfg := newDaemonDir(t, "replicaz: {}\n")
	_, err := runCLI(cfg, "serve")
	if err == nil || !strings.Contains(err.Error(), "replicaz") {
		t.Fatalf("want a start-up error naming replicaz, got %v", err)
	}
}

func TestHealthAndReadiness(t *testing.T) {
	t.Parallel()
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	// The listener opens before the scheduler has recovered what the last
	// run left (on a loaded box that takes a while): ready is when it says so.
	d.logs.waitFor(t, `"scheduler ready"`, 30*time.Second)
	for _, path := range []string{"/healthz", "/readyz"} {
		if status, body := do(t, "GET", d.base+path, nil, ""); status != 200 {
			t.Fatalf("%s: %d %v", path, status, body)
		}
	}
}
