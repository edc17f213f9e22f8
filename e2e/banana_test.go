package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"inferd/internal/testenv"
)

// TestBananaJavaScriptClients runs the public Banana clients from npm
// (@banana-dev/banana-dev 4.0.0 for run/start/check, 6.2.0 for the project API),
// unmodified, against a live inferd serving examples/echo. `make test` installs
// them from examples/banana-js/package-lock.json and sets
// INFERD_REQUIRE_CLIENT_TESTS=1, so there this test cannot skip.
func TestBananaJavaScriptClients(t *testing.T) {
	t.Parallel()
	node, skip := clientTestTools(t)
	clients, _ := filepath.Abs("examples/banana-js")
	if _, err := os.Stat(filepath.Join(clients, "node_modules", "banana-v4")); err != nil {
		skip("the Banana npm clients are not installed in examples/banana-js/node_modules")
	}

	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: 2s\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("bananas", false)
	d.apply("projects:\n" + echoProject("banana-echo", "bananas", "mk-banana", echo, marker(), "") + "    minReplicas: 1\n")

	cmd := exec.Command(node, "--test", "--test-reporter=spec", "clients.test.js")
	cmd.Dir = clients
	cmd.Env = append(os.Environ(),
		"BANANA_URL="+d.base+"/",
		"INFERD_BASE="+d.base,
		"INFERD_KEY="+key,
		"INFERD_MODEL=mk-banana",
		"INFERD_PROJECT=banana-echo",
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("Banana clients failed against inferd: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "pass 6") {
		t.Fatalf("expected 6 passing client tests:\n%s", out)
	}
	fmt.Fprintf(os.Stderr, "%s", out)
}

// clientTestTools finds node for a test that drives a JavaScript client, and
// returns how to skip for a missing tool: testenv.Missing, so under `make test`
// (which installs every one) the skip fails the test instead.
func clientTestTools(t *testing.T) (node string, skip func(reason string)) {
	t.Helper()
	skip = func(reason string) {
		t.Helper()
		testenv.Missing(t, "%s (make test installs it)", reason)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		skip("node is not installed")
	}
	return node, skip
}
