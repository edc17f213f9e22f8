package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// TestBootFailuresSayWhyAndFailFast runs one broken model of each kind and
// checks that the call's error says what to fix, with the model's last line,
// and that it comes far sooner than three boot timeouts: a model on the wrong
// port, with a missing health path or with no GET at all (501) is found out
// within seconds, a crash loop after its retries,
// and a model that never gets ready after one bootTimeout. A call started
// while the project backs off fails at once with the same reason, and calls
// that wait between boots say which attempt runs and why the last failed.
func TestBootFailuresSayWhyAndFailFast(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	// The backoffs and the never-ready model's bootTimeout stretch on a
	// busy machine, as the bounds below do: a boot, and the call made
	// after each failure, must land within them however slow the box.
	bootTimeout := scaledSeconds(4 * time.Second)
	dir, cfg := newDaemonDir(t, "startWait: 1s\nlongPollWait: 2s\ncpuSlots: 8\n"+
		"replica:\n  stopGrace: 2s\n  restartBackoff: "+scaledSetting(4*time.Second)+"\n  maxRestartBackoff: "+scaledSetting(30*time.Second)+
		"\n  maxBootFailures: 3\n")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	wrongPort := freePort(t)
	// A model with no GET at all: Python's http.server answers 501, and
	// logs the request (the model's last line).
	noGet := t.TempDir()
	if err := os.Chmod(noGet, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(noGet, "server.py"), []byte(`import os
from http.server import BaseHTTPRequestHandler, HTTPServer
class H(BaseHTTPRequestHandler):
    def do_POST(self): pass
print("serving POST only", flush=True)
HTTPServer(("127.0.0.1", int(os.environ["PORT"])), H).serve_forever()
`), 0o644); err != nil {
		t.Fatal(err)
	}
	d.apply("projects:\n" +
		fmt.Sprintf("  - {id: noget, team: acme, modelKey: mk-noget, command: [python3, server.py], dir: %s, bootTimeout: 600}\n", noGet) +
		echoProject("wrongport", "acme", "mk-wrongport", echo, mark, fmt.Sprintf(`, LISTEN_PORT: "%d"`, wrongPort)) +
		"    bootTimeout: 600\n" +
		echoProject("nohealth", "acme", "mk-nohealth", echo, mark, "") + "    healthPath: /ready\n    bootTimeout: 600\n" +
		echoProject("crashes", "acme", "mk-crashes", echo, mark, `, BOOT_FAIL: "1"`) + "    bootTimeout: 600\n" +
		echoProject("slow", "acme", "mk-slow", echo, mark, `, NEVER_READY: "1"`) + fmt.Sprintf("    bootTimeout: %d\n", bootTimeout))
	c := faultClient{base: d.base, key: key}

	for _, tc := range []struct {
		name, modelKey string
		want           *regexp.Regexp
		within         time.Duration
	}{
		{"wrong port", "mk-wrongport", regexp.MustCompile(`^error: model failed to start: no answer on 127\.0\.0\.1:\d+ \(the model must listen on \$PORT\); it listens on ` +
			fmt.Sprint(wrongPort) + `; last output: echo model listening on 127\.0\.0\.1:\d+$`), 10 * time.Second},
		{"health path answers 404", "mk-nohealth", regexp.MustCompile(`^error: model failed to start: GET /ready answered 404 \(set healthPath\); last output: echo model listening on 127\.0\.0\.1:\d+$`), 10 * time.Second},
		{"no GET route at all (501)", "mk-noget", regexp.MustCompile(`^error: model failed to start: GET /healthz answered 501 \(set healthPath\); last output: .*"GET /healthz HTTP/1\.1" 501`), 10 * time.Second},
		// Three boots with backoffs of 4 s and 8 s between them. (The
		// backoff is long enough that the call made after each failure
		// below lands within it on a loaded box.)
		{"exits at boot", "mk-crashes", regexp.MustCompile(`^error: model failed to start: process exited with status 1: boot failed: BOOT_FAIL is set$`), 30 * time.Second},
		// One bootTimeout of 4 s, not three.
		{"never ready", "mk-slow", regexp.MustCompile(`^error: model failed to start: not ready after bootTimeout ` + fmt.Sprint(bootTimeout) + `s: GET /healthz answered 503; last output: echo model listening on 127\.0\.0\.1:\d+$`), 10 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			r, err := c.start(tc.modelKey, `{}`, true)
			if err != nil {
				t.Fatal(err)
			}
			id := r["callID"].(string)
			var pending []string
			if tc.modelKey == "mk-crashes" {
				want := "booting (attempt 2 of 3; last: process exited with status 1)"
				eventually(t, 10*time.Second, "the call to say "+want, func() bool {
					if r, err = c.check(id, false); err != nil {
						t.Fatal(err)
					}
					pending = append(pending, message(r))
					return message(r) == want || isFinal(r)
				})
				if message(r) != want {
					t.Errorf("between boots the call said %q, want %q", pending, want)
				}
			}
			for !isFinal(r) {
				if m := message(r); len(pending) == 0 || pending[len(pending)-1] != m {
					pending = append(pending, m)
				}
				if r, err = c.check(id, true); err != nil {
					t.Fatal(err)
				}
			}
			took := time.Since(start)
			if msg := message(r); !tc.want.MatchString(msg) {
				t.Fatalf("message %q, want %s", msg, tc.want)
			}
			if took > testenv.Scale(tc.within) {
				t.Errorf("the call failed after %v, want within %v [%s]", took, testenv.Scale(tc.within), testenv.Load())
			}
			for _, m := range pending {
				if strings.Contains(strings.ToLower(m), "error") {
					t.Errorf("pending message %q says error", m)
				}
			}
			// The project backs off now: a new call fails at once, saying why.
			again, err := c.start(tc.modelKey, `{}`, false)
			if err != nil {
				t.Fatal(err)
			}
			if msg := message(again); !strings.HasPrefix(msg, message(r)+" (next boot in ") {
				t.Errorf("a call during the backoff answered %q", msg)
			}
		})
	}
	t.Run("status page names the reason", func(t *testing.T) {
		code, body := doRaw(t, "GET", d.base+"/v1/status/projects", map[string]string{"X-Service-API-Key": key}, "")
		if code != 200 || !strings.Contains(string(body), `GET /ready answered 404 (set healthPath)`) {
			t.Fatalf("status: HTTP %d %s", code, body)
		}
	})
}
