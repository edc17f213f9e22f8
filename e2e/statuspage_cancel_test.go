package e2e

import (
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestStatusPageCancelButton clicks Cancel beside a queued call on the
// status page (in Debian's chromium, like TestStatusPageInBrowser) and checks
// that the call is cancelled for every client.
func TestStatusPageCancelButton(t *testing.T) {
	t.Parallel()
	node, browser, script := browserTools(t)
	echo := echoDir(t)
	d, c, key := callControlDaemon(t, "", echoProject("busy", "acme", "mk-busy", echo, marker(), "")+"    maxReplicas: 1\n")
	// The running call holds the one replica until it is cancelled below,
	// however long the browser takes, so the queued one stays queued.
	running := c.start("mk-busy", `{"sleep":600}`, true)["callID"].(string)
	c.waitState(running, "running")
	queued := c.start("mk-busy", `{"n":1}`, true)["callID"].(string)

	cmd := exec.Command(node, "cancel.mjs")
	cmd.Dir = script
	cmd.Env = append(os.Environ(), "INFERD_BASE="+d.base, "INFERD_KEY="+key, "CANCEL_CALL="+queued, "CHROMIUM="+browser, browserTimeout())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS cancel button") {
		t.Fatalf("cancel button check failed: %v\n%s", err, out)
	}
	if r := c.check(queued, false); r["message"] != "error: cancelled by request" {
		t.Errorf("call cancelled on the page: %v", r)
	}
	c.cancel(running)
	eventually(t, 10*time.Second, "the replica is free", func() bool {
		s := d.replicaStates(key, "busy")
		return len(s) == 1 && s[0] == "ready"
	})
}
