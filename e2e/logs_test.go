package e2e

import (
	"bufio"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// TestLogsCommand reads a replica's log with `inferd logs` through the
// daemon, follows it live with -f, and reads it from the files once the
// daemon has stopped.
func TestLogsCommand(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, marker(), "") + "    minReplicas: 1\n")
	eventually(t, 30*time.Second, "echo-1 has logged", func() bool {
		out, err := d.cli("logs", "echo")
		return err == nil && strings.Contains(out, "echo model listening")
	})
	if _, err := d.cli("logs", "echo", "--replica", "echo-9"); err == nil || !strings.Contains(err.Error(), "no log for replica echo-9") {
		t.Errorf("unknown replica: %v", err)
	}
	if _, err := d.cli("logs", "nope"); err == nil || !strings.Contains(err.Error(), "no logs for project nope") {
		t.Errorf("unknown project: %v", err)
	}

	// Follow echo-1, then make it print and crash.
	f := exec.Command(inferdBin, "--config", cfg, "logs", "echo", "--replica", "echo-1", "-n", "1", "-f")
	stdout, err := f.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Process.Kill(); f.Wait() })
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	waitLine := func(want string) {
		t.Helper()
		timeout := scaledAfter(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("logs -f ended before %q", want)
				}
				if strings.Contains(l, want) {
					return
				}
			case <-timeout:
				t.Fatal(testenv.Waited(30*time.Second, fmt.Sprintf("logs -f to print %q", want)))
			}
		}
	}
	waitLine("echo model listening")
	c := inferenceClient{t: t, base: d.base, key: key}
	c.start("mk-echo", `{"crash":true}`, false)
	waitLine("crashing on request")

	// The daemon's shutdown ends the follow rather than waiting for it.
	d.stop()
	for range lines {
	}
	out, err := d.cli("logs", "echo", "--replica", "echo-1", "-f")
	if err != nil || !strings.Contains(out, "crashing on request") {
		t.Errorf("logs without a daemon: %q, %v", out, err)
	}
}
