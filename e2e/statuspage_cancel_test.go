package e2e

import (
	"encoding/json"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestStatusPageCancelButton clicks Cancel beside two queued calls on the
// status page (in Debian's chromium, like TestStatusPageInBrowser) and
// checks that each is cancelled for every client: one started with
// startOnly, and one a synchronous start still waiting, which nothing has
// written yet (it is written when it ends): the page lists it from the
// scheduler, and its client hears of the cancel.
func TestStatusPageCancelButton(t *testing.T) {
	t.Parallel()
	node, browser, script := browserTools(t)
	echo := echoDir(t)
	// startWait well beyond the browser's run: the sync start must still
	// wait, unwritten, when its Cancel is clicked.
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(120*time.Second)+"\nlongPollWait: "+scaledSetting(10*time.Second)+"\nreplica:\n  stopGrace: 2s\n  restartBackoff: 100ms\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("busy", "acme", "mk-busy", echo, marker(), "") + "    maxReplicas: 1\n")
	c := inferenceClient{t: t, base: d.base, key: key}
	// The running call holds the one replica until it is cancelled below,
	// however long the browser takes, so the queued ones stay queued.
	running := c.start("mk-busy", `{"sleep":600}`, true)["callID"].(string)
	c.waitState(running, "running")
	queued := c.start("mk-busy", `{"n":1}`, true)["callID"].(string)

	type answer struct {
		obj map[string]any
		err error
	}
	syncAnswer := make(chan answer, 1)
	go func() {
		obj, err := c.tryStart("mk-busy", `{"n":2}`, false)
		syncAnswer <- answer{obj, err}
	}()
	var syncID string
	eventually(t, 10*time.Second, "the sync start's call listed", func() bool {
		select {
		case a := <-syncAnswer:
			t.Fatalf("the sync start answered %v, %v before its call was listed", a.obj, a.err)
		default:
		}
		for _, call := range d.statusCalls(key) {
			if call.ProjectID == "busy" && call.State == "queued" && call.ID != queued {
				syncID = call.ID
			}
		}
		return syncID != ""
	})

	cmd := exec.Command(node, "cancel.mjs")
	cmd.Dir = script
	cmd.Env = append(os.Environ(), "INFERD_BASE="+d.base, "INFERD_KEY="+key, "CANCEL_CALL="+queued+","+syncID, "CHROMIUM="+browser, browserTimeout())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "PASS cancel button") {
		t.Fatalf("cancel button check failed: %v\n%s", err, out)
	}
	for _, id := range []string{queued, syncID} {
		if r := c.check(id, false); r["message"] != "error: cancelled by request" {
			t.Errorf("call %s cancelled on the page: %v", id, r)
		}
	}
	if a := <-syncAnswer; a.err != nil || a.obj["callID"] != syncID || a.obj["message"] != "error: cancelled by request" {
		t.Errorf("the sync start answered %v, %v; want its call %s cancelled", a.obj, a.err, syncID)
	}
	c.cancel(running)
	eventually(t, 10*time.Second, "the replica is free", func() bool {
		s := d.replicaStates(key, "busy")
		return len(s) == 1 && s[0] == "ready"
	})
}

// statusCall is a row of /v1/status/calls.
type statusCall struct {
	ID        string `json:"id"`
	ProjectID string `json:"projectId"`
	State     string `json:"state"`
}

// statusCalls lists the calls the status page shows to key.
func (d *daemon) statusCalls(key string) []statusCall {
	d.t.Helper()
	code, body := doRaw(d.t, "GET", d.base+"/v1/status/calls", map[string]string{"X-Service-API-Key": key}, "")
	if code != http.StatusOK {
		d.t.Fatalf("status calls: HTTP %d %s", code, body)
	}
	var all struct {
		Results []statusCall `json:"results"`
	}
	if err := json.Unmarshal(body, &all); err != nil {
		d.t.Fatalf("status calls: %v in %s", err, body)
	}
	return all.Results
}
