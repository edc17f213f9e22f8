package e2e

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
)

// forcing503 is a proxy in front of inferd that forwards every request and
// copies the answer back, except the first answer to a call of route
// /second: inferd has run it, and the client is told 503, as a Banana
// gateway under load would. The SDK retries that with the same
// X-Banana-Request-Id.
type forcing503 struct {
	target string
	mu     sync.Mutex
	forced int
	ids    []string // X-Banana-Request-Id of each /second request
}

func (p *forcing503) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	req, _ := http.NewRequest(r.Method, p.target+r.URL.Path, bytes.NewReader(body))
	req.Header = r.Header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	p.mu.Lock()
	force := false
	if strings.HasSuffix(r.URL.Path, "/second") {
		p.ids = append(p.ids, r.Header.Get("X-Banana-Request-Id"))
		force = p.forced == 0
		if force {
			p.forced++
		}
	}
	p.mu.Unlock()
	if force {
		http.Error(w, "forced by the test proxy", http.StatusServiceUnavailable)
		return
	}
	for k, v := range resp.Header {
		w.Header()[k] = v
	}
	w.WriteHeader(resp.StatusCode)
	w.Write(out)
}

// TestBananaClientSDK runs the public Banana JavaScript SDK 6.2.0's Client,
// unmodified, against an unmodified Potassium app behind inferd's /run
// routes: its call to "/" and to a second route, warmup, a handler
// exception, and a call it retries after a forced 503 that runs the model
// once.
func TestBananaClientSDK(t *testing.T) {
	t.Parallel()
	node, skip := clientTestTools(t)
	clients, _ := filepath.Abs("examples/banana-js")
	if _, err := os.Stat(filepath.Join(clients, "node_modules", "banana-v6")); err != nil {
		skip("the Banana npm clients are not installed in examples/banana-js/node_modules")
	}
	if err := exec.Command("python3", "-c", "import flask, werkzeug").Run(); err != nil {
		skip("python3 with Flask is needed for the Potassium test double")
	}
	app, _ := filepath.Abs("examples/potassium")
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("bananas", false)
	d.apply(fmt.Sprintf(`projects:
  - id: kclient
    team: bananas
    modelKey: mk-kclient
    command: ["python3", "app.py"]
    dir: %s
    protocol: potassium
    env: {E2E_MARKER: "%s"}
    minReplicas: 0
    maxReplicas: 1
`, app, marker()))
	proxy := &forcing503{target: d.base}
	ps := httptest.NewServer(proxy)
	defer ps.Close()

	cmd := exec.Command(node, "--test", "--test-reporter=spec", "client.test.js")
	cmd.Dir = clients
	cmd.Env = append(os.Environ(),
		"INFERD_RUN_URL="+d.base+"/run/kclient",
		"INFERD_PROXY_URL="+ps.URL+"/run/kclient",
		"INFERD_BASE="+d.base,
		"INFERD_KEY="+key,
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("the Banana Client SDK failed against inferd: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "pass 6") {
		t.Fatalf("expected 6 passing client tests:\n%s", out)
	}
	proxy.mu.Lock()
	defer proxy.mu.Unlock()
	if proxy.forced != 1 || len(proxy.ids) != 2 || proxy.ids[0] == "" || proxy.ids[0] != proxy.ids[1] {
		t.Errorf("proxy forced %d 503s and saw request ids %v; want one 503 and its retry under the same id", proxy.forced, proxy.ids)
	}
}
