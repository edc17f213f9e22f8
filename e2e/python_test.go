package e2e

// Per-project Python environments (issue 46): a project's python: builds a
// venv offline from a wheelhouse, once, shared by a second project with the
// same requirements; a bad build fails its calls with pip's words.

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/internal/testwheel"
)

// greetServer is a model that answers with its package's greeting and
// where its Python lives.
const greetServer = `import greet, http.server, json, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def reply(self, obj):
        body = json.dumps(obj).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def do_GET(self):
        self.reply({"ok": True})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply({"greeting": greet.hello(), "prefix": sys.prefix, "uid": os.getuid()})
http.server.ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), H).serve_forever()
`

// TestPythonProjectsRunOfflineFromAWheelhouseAndShareTheirVenv: with no
// package index reachable, a project with python: waits "building
// environment" while its venv is built from its wheelhouse (pip's output in
// inferd logs), then answers from it under a uid of its own; a second
// project with the same requirements answers from the same venv without a
// build; a requirement the wheelhouse lacks, or one that needs the network,
// fails the call with pip's last lines.
func TestPythonProjectsRunOfflineFromAWheelhouseAndShareTheirVenv(t *testing.T) {
	testenv.NeedRoot(t, "models run under a uid of their own, reaching the venv through their mount namespace, only as root")
	t.Parallel()
	// nothing answers the index: an offline box. A sync start waits out a
	// venv's build (pip's), minutes on a busy machine.
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(50*time.Second)+"\npython:\n  index: http://127.0.0.1:9/simple\n")
	model := filepath.Join(dir, "model")
	house := testwheel.Wheelhouse(t, dir, "greet", "hello from the wheelhouse")
	files := map[string]string{"server.py": greetServer, "requirements.txt": "greet==1.0\n", "missing.txt": "greet==1.0\nabsent-package==2.0\n"}
	if err := os.MkdirAll(model, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(model, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	openToAll(t, filepath.Dir(dir), dir, model, house)
	d := startDaemonEnv(t, dir, cfg)
	key := d.createKey("acme", false)
	entry := func(id, reqs, wheels string) string {
		return "  - {id: " + id + ", team: acme, modelKey: mk-" + id + `, command: ["python3", "server.py"], dir: model, bootTimeout: 60, ` +
			"python: {requirements: model/" + reqs + wheels + ", interpreter: " + testwheel.Python + "}}\n"
	}
	d.apply("projects:\n" + entry("py-a", "requirements.txt", ", wheelhouse: wheels") + entry("py-b", "requirements.txt", ", wheelhouse: wheels") +
		entry("py-missing", "missing.txt", ", wheelhouse: wheels") + entry("py-online", "requirements.txt", ""))
	c := inferenceClient{t: t, base: d.base, key: key}

	callID := c.start("mk-py-a", `{}`, true)["callID"].(string)
	// The build takes seconds (venv, ensurepip, pip): once the daemon logs
	// that it began, the call says what it waits for.
	d.logs.waitFor(t, `"phase":"building environment"`, 2*time.Minute)
	if w, _ := c.check(callID, false)["waitingFor"].(map[string]any); w == nil || w["code"] != "buildingEnvironment" ||
		!strings.HasPrefix(w["text"].(string), "building environment (") {
		t.Errorf("while its venv builds the call waits for %v, want buildingEnvironment", w)
	}
	r := c.waitResult(callID)
	if r["message"] != "success" {
		t.Fatalf("py-a: %v\n%s", r, d.logs)
	}
	a := r["modelOutputs"].([]any)[0].(map[string]any)
	prefix, _ := a["prefix"].(string)
	if a["greeting"] != "hello from the wheelhouse" || !strings.HasPrefix(prefix, filepath.Join(dir, "data", "python")+"/") || a["uid"] == 0.0 {
		t.Errorf("py-a answered %v: want the wheel's greeting from a venv under the data dir, as a uid of its own", a)
	}
	b := c.start("mk-py-b", `{}`, false)
	if b["message"] != "success" || b["modelOutputs"].([]any)[0].(map[string]any)["prefix"] != prefix {
		t.Errorf("py-b answered %v: want the same venv %s", b, prefix)
	}
	if n := strings.Count(d.logs.String(), `"phase":"building environment"`); n != 1 {
		t.Errorf("%d environment builds in the daemon's log, want 1", n)
	}
	if out, err := d.cli("logs", "py-a"); err != nil || !strings.Contains(out, "Successfully installed greet-1.0") {
		t.Errorf("inferd logs py-a: %v\n%s\nwant pip's output", err, out)
	}

	for _, tc := range []struct{ modelKey, want string }{
		{"mk-py-missing", "No matching distribution found for absent-package==2.0"},
		{"mk-py-online", "No matching distribution found for greet==1.0"},
	} {
		// The build may outlast the start's wait on a loaded box: the
		// answer that counts is the call's end.
		r := c.waitResult(c.start(tc.modelKey, `{}`, true)["callID"].(string))
		if msg, _ := r["message"].(string); !strings.HasPrefix(msg, "error: ") || !strings.Contains(msg, tc.want) {
			t.Errorf("%s: %v; want an error with pip's %q", tc.modelKey, r["message"], tc.want)
		}
	}
}
