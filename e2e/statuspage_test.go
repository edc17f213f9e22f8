package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// TestStatusPageInBrowser drives the status page in Debian's chromium
// (headless, through playwright-core from web/browsertest) against a live
// inferd with two simulated GPUs and three projects: captioner, idle after
// one call; detector, with a failed call; broken, whose model never boots.
// While detector is kept busy, the page must show detector and broken first,
// captioner compact after them, the charts with data, the failed boot's log
// behind a link and a replica's log beside it. `make test` installs chromium and the node module and sets
// INFERD_REQUIRE_CLIENT_TESTS=1, so there this test cannot skip. The page's
// screenshot goes to $INFERD_ARTIFACTS (CI keeps it) or the test's temp dir.
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel()
	node, browser, script := browserTools(t)
	shots := os.Getenv("INFERD_ARTIFACTS")
	if shots == "" {
		shots = t.TempDir()
	} else if err := os.MkdirAll(shots, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(shots, "status-page.png")
	usageShot := filepath.Join(shots, "usage-panel.png")

	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "usage:\n  flushInterval: 2s\ngpu:\n  simulate:\n"+
		"    - {name: \"Simulated A100\", memoryMiB: 40960}\n"+
		"    - {name: \"Simulated L4\", memoryMiB: 24576}\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("vision", false)
	mark := marker()
	d.apply("teams:\n  - {id: vision, quota: {replicas: 8}}\nprojects:\n" +
		echoProject("captioner", "vision", "mk-captioner", echo, mark, "") + "    gpus: 1\n    minReplicas: 1\n" +
		echoProject("detector", "vision", "mk-detector", echo, mark, "") + "    gpus: 1\n    minReplicas: 1\n    maxReplicas: 2\n" +
		echoProject("broken", "vision", "mk-broken", echo, mark, `, BOOT_FAIL: "1"`) + "    minReplicas: 1\n")
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

	// Load on detector while the page is open: calls come faster than its
	// one replica answers and no GPU is free for a second one, so its queue
	// grows, it waits for a GPU and the charts move. Stopped (and waited
	// for) when the browser is done; bounded in count anyway, below the 50
	// recent calls the page lists, so that captioner's call (EXPECT_CALL)
	// stays among them however slowly the browser gets to it. Each takes 2 s,
	// so that detector has work (and goes first) for over a minute.
	loadCtx, stopLoad := context.WithCancel(t.Context())
	loadDone := make(chan struct{})
	go func() {
		defer close(loadDone)
		tick := time.NewTicker(250 * time.Millisecond)
		defer tick.Stop()
		client := &http.Client{Timeout: 5 * time.Second}
		for i := range 40 {
			select {
			case <-loadCtx.Done():
				return
			case <-tick.C:
			}
			in := fmt.Sprintf(`{"sleep":%.1f}`, testenv.Scale(2*time.Second).Seconds())
			if i%6 == 5 {
				in = `{"fail":"image too blurry"}`
			}
			body := fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-detector","startOnly":true,"modelInputs":%s}`, key, in)
			if res, err := client.Post(d.base+"/start/v4", "application/json", strings.NewReader(body)); err == nil {
				io.Copy(io.Discard, res.Body)
				res.Body.Close()
			}
		}
	}()
	defer func() { stopLoad(); <-loadDone }()

	cmd := exec.Command(node, "statuspage.mjs")
	cmd.Dir = script
	cmd.Env = append(os.Environ(),
		"INFERD_BASE="+d.base,
		"INFERD_KEY="+key,
		"EXPECT_GPUS=2",
		"EXPECT_PROJECTS=broken,captioner,detector",
		"EXPECT_FIRST=detector,broken", // both failed; detector has work too
		"EXPECT_QUIET=captioner",
		"EXPECT_FAILED=broken:BOOT_FAIL is set",
		"EXPECT_CALL="+callID,
		"EXPECT_REPLICA=captioner-1",
		"EXPECT_TEAM=vision:8",
		"EXPECT_QUEUED=detector",
		"EXPECT_USAGE=vision",
		"SCREENSHOT="+shot,
		"USAGE_SCREENSHOT="+usageShot,
		"CHROMIUM="+browser,
		browserTimeout(),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("status page check failed: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "PASS status page") {
		t.Fatalf("the browser script did not finish:\n%s", out)
	}
	fmt.Fprintf(os.Stderr, "%s", out)
	t.Logf("status page screenshot: %s; usage panel: %s", shot, usageShot)
}

// browserTimeout is the browser scripts' TIMEOUT_MS: how long each of
// their steps may wait, 30 s stretched by testenv.Scale as every deadline
// of the tests is.
func browserTimeout() string {
	return fmt.Sprintf("TIMEOUT_MS=%d", testenv.Scale(30*time.Second).Milliseconds())
}

// browserTools returns node, Debian's chromium and the web/browsertest
// folder with playwright-core installed, or skips the test (fails it under
// INFERD_REQUIRE_CLIENT_TESTS=1) when one is missing.
func browserTools(t *testing.T) (node, browser, script string) {
	t.Helper()
	node, skip := clientTestTools(t)
	browser = "/usr/bin/chromium"
	if _, err := os.Stat(browser); err != nil {
		skip("chromium is not installed")
	}
	script, _ = filepath.Abs("web/browsertest")
	if _, err := os.Stat(filepath.Join(script, "node_modules", "playwright-core")); err != nil {
		skip("playwright-core is not installed in web/browsertest/node_modules")
	}
	return node, browser, script
}
