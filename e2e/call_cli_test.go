package e2e

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// inferd call calls a model from the shell, as ollama run does: it prints
// the outputs, one JSON value a line, reads its inputs from stdin with -,
// prints each streamed line as the model streams it with --stream, and
// exits 1 with the call's error message when the call fails.
func TestInferdCallPrintsTheOutputsAndExitsNonZeroOnFailure(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	stream, _ := filepath.Abs("examples/stream")
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	d.apply(fmt.Sprintf("projects:\n%s  - id: stream\n    team: acme\n    modelKey: mk-stream\n    command: [\"python3\", \"server.py\"]\n    dir: %s\n",
		echoProject("echo", "acme", "mk-echo", echo, marker(), ""), stream))

	inferd := func(stdin string, args ...string) (stdout, stderr string, code int) {
		t.Helper()
		cmd := exec.Command(inferdBin, append([]string{"--config", cfg}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		if ee, ok := err.(*exec.ExitError); ok {
			return o.String(), e.String(), ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return o.String(), e.String(), 0
	}
	for _, tc := range []struct {
		name, stdin string
		args        []string
		code        int
		stdout      string // a line it prints
		stderr      string
	}{
		{"inputs as an argument", "", []string{"call", "echo", `{"prompt":"hi"}`}, 0, `{"echo":{"prompt":"hi"}`, ""},
		{"inputs from stdin", `{"n": 7}`, []string{"call", "echo", "-"}, 0, `{"echo":{"n":7}`, ""},
		{"a model that streams, without --stream", "", []string{"call", "stream", `{"prompt":"a b","delay":0}`}, 0, `{"token":"b","index":1}`, ""},
		{"a failing call", "", []string{"call", "echo", `{"fail":"no such prompt"}`}, 1, "", `error: model returned HTTP 500: {"error": "no such prompt"}`},
		{"an unknown project", "", []string{"call", "nope", `{}`}, 1, "", "project nope not found"},
		{"inputs that are no JSON", "", []string{"call", "echo", `{prompt`}, 2, "", "INPUTS is not valid JSON"},
		{"no inputs", "", []string{"call", "echo"}, 2, "", "call needs PROJECT and INPUTS"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errOut, code := inferd(tc.stdin, tc.args...)
			if code != tc.code || !strings.Contains(out, tc.stdout) || !strings.Contains(errOut, tc.stderr) {
				t.Errorf("inferd %s: exit %d, stdout %q, stderr %q; want exit %d, %q, %q",
					strings.Join(tc.args, " "), code, out, errOut, tc.code, tc.stdout, tc.stderr)
			}
		})
	}

	// --stream prints the model's first line while the call still runs:
	// the model waits for a file after it, which the test makes only once
	// it has read the line.
	gate := filepath.Join(t.TempDir(), "go-on")
	cmd := exec.Command(inferdBin, "--config", cfg, "call", "--stream", "stream",
		fmt.Sprintf(`{"prompt":"one two","delay":0,"waitFor":%q}`, gate))
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var errOut bytes.Buffer
	cmd.Stderr = &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := bufio.NewScanner(pipe)
	first := make(chan string, 1)
	go func() {
		if lines.Scan() {
			first <- lines.Text()
		}
		close(first)
	}()
	select {
	case line := <-first:
		if line != `{"token":"one","index":0}` {
			t.Fatalf("first streamed line %q", line)
		}
	case <-scaledAfter(2 * time.Minute):
		t.Fatalf("%s; stderr %q", testenv.Waited(2*time.Minute, "the first streamed line"), errOut.String())
	}
	if err := os.WriteFile(gate, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	var rest []string
	for lines.Scan() {
		rest = append(rest, lines.Text())
	}
	if err := cmd.Wait(); err != nil || strings.Join(rest, "\n") != `{"token":"two","index":1}`+"\n"+`{"done":true,"tokens":2}` {
		t.Errorf("inferd call --stream: %v, then %q (stderr %q)", err, rest, errOut.String())
	}

	// Ctrl-C cancels the call: the model's request is aborted and the call
	// ends cancelled.
	key := d.createKey("acme", false)
	cmd = exec.Command(inferdBin, "--config", cfg, "call", "echo", `{"hang":true}`)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	eventually(t, 2*time.Minute, "the hanging call to run", func() bool {
		return slices.Contains(d.replicaStates(key, "echo"), "busy")
	})
	if err := cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	if err := cmd.Wait(); err == nil {
		t.Error("inferd call exited 0 after Ctrl-C")
	}
	eventually(t, time.Minute, "the interrupted call to end cancelled", func() bool {
		_, body := doRaw(t, "GET", d.base+"/v1/status/calls", map[string]string{"X-Service-API-Key": key}, "")
		return strings.Contains(string(body), `"message":"error: cancelled by request"`)
	})
}
