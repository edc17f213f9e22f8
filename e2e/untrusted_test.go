package e2e

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestUntrustedTextIsEscapedOrRefused: what a model prints reaches the
// operator's terminal (inferd logs) and the status page with its terminal
// controls escaped, so it cannot clear the screen or write the clipboard;
// call inputs and model replies that are not UTF-8 are refused, naming the
// byte, instead of being passed to clients that cannot parse them.
func TestUntrustedTextIsEscapedOrRefused(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	// The model clears the screen, writes "pwned" to the clipboard (OSC 52)
	// and rings the bell before it starts serving.
	project := strings.Replace(echoProject("hostile", "acme", "mk-hostile", echo, marker(), ""),
		`["python3", "server.py"]`, `["sh", "-c", "printf '\\033[2J\\033]52;c;cHduZWQ=\\007pwned\\n'; exec python3 server.py"]`, 1)
	d.apply("projects:\n" + project + "    minReplicas: 1\n")
	const shown = `\x1b[2J\x1b]52;c;cHduZWQ=\x07pwned`

	eventually(t, 30*time.Second, "the hostile model to be ready", func() bool {
		s := d.replicaStates(key, "hostile")
		return len(s) == 1 && s[0] == "ready"
	})
	t.Run("inferd logs", func(t *testing.T) {
		out, err := d.cli("logs", "hostile")
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(out, shown) || strings.ContainsAny(out, "\x1b\x07") {
			t.Fatalf("inferd logs printed %q, want %q escaped", out, shown)
		}
	})
	t.Run("status page", func(t *testing.T) {
		code, body := doRaw(t, "GET", d.base+"/v1/status/projects/hostile/replicas/hostile-1/logs", map[string]string{"X-Service-API-Key": key}, "")
		var log struct{ Lines []string }
		if err := json.Unmarshal(body, &log); code != 200 || err != nil {
			t.Fatalf("HTTP %d %s (%v)", code, body, err)
		}
		if len(log.Lines) == 0 || log.Lines[0] != shown {
			t.Fatalf("lines %q, want first %q", log.Lines, shown)
		}
	})
	c := faultClient{base: d.base, key: key}
	t.Run("call input that is not UTF-8", func(t *testing.T) {
		r, err := c.start("mk-hostile", "{\"prompt\":\"caf\xe9\"}", false)
		if err != nil {
			t.Fatal(err)
		}
		if got := message(r); !strings.HasPrefix(got, "error: request body is not valid UTF-8 at byte ") {
			t.Fatalf("message %q", got)
		}
	})
	t.Run("model reply that is not UTF-8", func(t *testing.T) {
		r, err := c.start("mk-hostile", `{"latin1":"café"}`, false)
		if err != nil {
			t.Fatal(err)
		}
		// {"text": "caf\xe9"}: the bad byte is the 14th, at offset 13.
		if got := message(r); got != "error: model returned an invalid reply: reply is not valid UTF-8 at byte 13" {
			t.Fatalf("message %q", got)
		}
	})
}
