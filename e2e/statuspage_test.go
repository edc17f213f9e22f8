package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStatusPageInBrowser drives the status page in Debian's chromium
// (headless, through playwright-core from web/browsertest) against a live
// inferd with two simulated GPUs and two projects, after one call has
// finished. `make test` installs chromium and the node module and sets
// INFERD_REQUIRE_CLIENT_TESTS=1, so there this test cannot skip. The page's
// screenshot goes to $INFERD_ARTIFACTS (CI keeps it) or the test's temp dir.
func TestStatusPageInBrowser(t *testing.T) {
	node, skip := clientTestTools(t)
	browser := "/usr/bin/chromium"
	if _, err := os.Stat(browser); err != nil {
		skip("chromium is not installed")
	}
	script, _ := filepath.Abs("web/browsertest")
	if _, err := os.Stat(filepath.Join(script, "node_modules", "playwright-core")); err != nil {
		skip("playwright-core is not installed in web/browsertest/node_modules")
	}
	shots := os.Getenv("INFERD_ARTIFACTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(shots, "status-page.png")

	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "gpu:\n  simulate:\n"+
		"    - {name: \"Simulated A100\", memoryMiB: 40960}\n"+
		"    - {name: \"Simulated L4\", memoryMiB: 24576}\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("vision", false)
	mark := marker()
	d.apply("projects:\n" +
		echoProject("captioner", "vision", "mk-captioner", echo, mark, "") + "    gpus: 1\n    minReplicas: 1\n" +
		echoProject("detector", "vision", "mk-detector", echo, mark, "") + "    gpus: 1\n    minReplicas: 1\n    maxReplicas: 2\n")
	c := inferenceClient{t: t, base: d.base, key: key}
	r := c.start("mk-captioner", `{"prompt":"a cat on a mat"}`, false)
	if r["message"] != "success" {
		t.Fatalf("call did not succeed: %v", r)
	}
	callID := r["callID"].(string)
	for _, in := range []string{`{"image":"street.jpg"}`, `{"fail":"no objects found"}`} {
		c.start("mk-detector", in, false)
	}
	// Both min-1 replicas hold their GPU before the page is looked at.
	eventually(t, 60*time.Second, "both replicas ready", func() bool {
		_, body := doRaw(t, "GET", d.base+"/v1/status/projects", map[string]string{"X-Service-API-Key": key}, "")
		return strings.Count(string(body), `"state":"ready"`) == 2
	})

	cmd := exec.Command(node, "statuspage.mjs")
	cmd.Dir = script
	cmd.Env = append(os.Environ(),
		"INFERD_BASE="+d.base,
		"INFERD_KEY="+key,
		"EXPECT_GPUS=2",
		"EXPECT_PROJECTS=captioner,detector",
		"EXPECT_CALL="+callID,
		"EXPECT_REPLICA=captioner-1",
		"SCREENSHOT="+shot,
		"CHROMIUM="+browser,
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("status page check failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PASS status page") {
		t.Fatalf("the browser script did not finish:\n%s", out)
	}
	fmt.Fprintf(os.Stderr, "%s", out)
	t.Logf("status page screenshot: %s", shot)
}
