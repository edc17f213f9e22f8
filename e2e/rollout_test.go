package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// versionModel is a model whose code says which version it is: the test
// edits VERSION in its file as a team edits its model's code.
const versionModel = `import json, os, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
VERSION = "v1"
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def reply(self, body):
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
    def do_GET(self): self.reply({"ok": True})
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(0.05)
        self.reply({"version": VERSION, "pid": os.getpid()})
# A model loading: it listens once the test lets it (GATE) and serves no
# call meanwhile.
while not os.path.exists(os.environ.get("GATE", "") or "/"): time.sleep(0.05)
ThreadingHTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
`

// A team edits its model's code and puts it into service, first with
// `inferd project restart`, then with `inferd apply` of the unchanged
// manifest (the files of dir changed): each time the new code serves, and
// under steady load not one call fails. The old replicas serve until the
// new ones are ready: while the new code's boot is held, calls go on being
// answered by the old code.
func TestProjectRestartAndApplyRollOntoNewCodeWithoutFailingACall(t *testing.T) {
	python := "/usr/bin/python3"
	if _, err := os.Stat(python); err != nil {
		t.Skip("needs /usr/bin/python3")
	}
	model := t.TempDir()
	if err := os.Chmod(model, 0o755); err != nil {
		t.Fatal(err)
	}
	gates := t.TempDir()
	// setVersion writes version v of the model, whose boot waits for the
	// file gates/v.
	setVersion := func(v string) {
		t.Helper()
		code := strings.Replace(versionModel, `VERSION = "v1"`, fmt.Sprintf("VERSION = %q", v), 1)
		code = strings.Replace(code, `os.environ.get("GATE", "")`, fmt.Sprintf("%q", filepath.Join(gates, v)), 1)
		if err := os.WriteFile(filepath.Join(model, "server.py"), []byte(code), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	openGate := func(v string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(gates, v), nil, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	setVersion("v1")
	openGate("v1")
	// Room for the new replicas beside the old ones, on any box.
	dir, cfg := newDaemonDir(t, "cpuSlots: 4\n")
	d := startDaemon(t, dir, cfg)
	manifest := fmt.Sprintf(`projects:
  - id: roll
    team: acme
    modelKey: mk-roll
    command: [%q, "server.py"]
    dir: %s
    minReplicas: 1
    maxReplicas: 2
    bootTimeout: 60
    idleTimeout: 300
`, python, model)
	if out := d.apply(manifest); !strings.Contains(out, "project roll (team acme): created") {
		t.Fatalf("apply: %s", out)
	}
	key := d.createKey("acme", false)
	call := func(n int) (string, error) {
		body := fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-roll","modelInputs":{"n":%d}}`, key, n)
		_, ans, err := tryDo("POST", d.base+"/start/v4", nil, body)
		if err != nil {
			return "", err
		}
		if ans["message"] != "success" {
			return "", fmt.Errorf("call %d: %v", n, ans["message"])
		}
		out := ans["modelOutputs"].([]any)[0].(map[string]any)
		return out["version"].(string), nil
	}
	if v, err := call(0); err != nil || v != "v1" {
		t.Fatalf("first call: %q %v", v, err)
	}

	// Steady load: two clients call back to back for the whole test; each
	// answer's version goes to seen, each failure to failed.
	var (
		mu     sync.Mutex
		failed []string
		calls  int
	)
	seen := make(chan string, 1)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for c := range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				v, err := call(c*1_000_000 + n)
				mu.Lock()
				calls++
				if err != nil {
					failed = append(failed, err.Error())
				}
				mu.Unlock()
				select {
				case seen <- v:
				case <-stop:
					return
				}
			}
		}()
	}
	// waitServes waits until every one of ten answers in a row comes from
	// version v: the old replicas are gone from service.
	waitServes := func(v string) {
		t.Helper()
		deadline := scaledAfter(2 * time.Minute)
		for inARow := 0; inARow < 10; {
			select {
			case got := <-seen:
				if got == v {
					inARow++
				} else {
					inARow = 0
				}
			case <-deadline:
				t.Fatalf("no run of ten answers from %s within 2m; log:\n%s", v, d.logs)
			}
		}
	}
	waitServes("v1")
	// heldBoot waits until a replica of the new code boots (held at its
	// gate), then for ten answers from the old code meanwhile, then lets
	// the boot go on.
	heldBoot := func(old, next string) {
		t.Helper()
		eventually(t, time.Minute, "a replica of "+next+" booting", func() bool {
			return slices.Contains(d.replicaStates(key, "roll"), "booting")
		})
		waitServes(old)
		openGate(next)
	}

	setVersion("v2")
	out, err := d.cli("project", "restart", "roll")
	if err != nil || !strings.Contains(out, "Restarting project roll") {
		t.Fatalf("project restart: %q %v", out, err)
	}
	heldBoot("v1", "v2")
	waitServes("v2")
	if list, err := d.cli("project", "list"); err != nil || !regexp.MustCompile(`roll .* dir:[0-9a-f]{12}\+1 `).MatchString(list) {
		t.Errorf("project list after a restart: %v\n%s; want its dir's revision and +1", err, list)
	}

	setVersion("v3")
	if out := d.apply(manifest); !strings.Contains(out, "project roll (team acme): updated: the files in dir: replacing its replicas one by one") {
		t.Fatalf("apply after the code changed: %s", out)
	}
	heldBoot("v2", "v3")
	waitServes("v3")
	if out := d.apply(manifest); !strings.Contains(out, "project roll (team acme): unchanged") {
		t.Errorf("apply of the same code again: %s", out)
	}

	close(stop)
	wg.Wait()
	if len(failed) > 0 {
		t.Errorf("%d of %d calls failed during the rolls, first: %s", len(failed), calls, failed[0])
	}
}
