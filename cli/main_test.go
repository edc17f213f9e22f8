package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// runCLI runs the CLI in-process with a context that is already cancelled, so
// a command that wrongly starts the daemon returns at once instead of serving;
// the test then sees it by the data dir it created.
func runInProcess(t *testing.T, args ...string) (code int, stdout, stderr string, dataDir string) {
	t.Helper()
	dataDir = filepath.Join(t.TempDir(), "data")
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	var out, errOut bytes.Buffer
	full := append([]string{"--data-dir", dataDir, "--listen", "127.0.0.1:0"}, args...)
	code = run(ctx, full, nil, &out, &errOut)
	return code, out.String(), errOut.String(), dataDir
}

func TestCLIHelpPrintsUsageAndExitsZero(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"key", "-h"}, {"project", "--help"}} {
		code, stdout, stderr, _ := runInProcess(t, args...)
		if code != 0 || !strings.Contains(stdout, "Usage:") || stderr != "" {
			t.Errorf("inferd %v: exit %d, stdout %q, stderr %q; want exit 0 and the usage on stdout", args, code, stdout, stderr)
		}
	}
}

func TestCLIUnknownGlobalFlagIsAUsageError(t *testing.T) {
	code, stdout, stderr, _ := runInProcess(t, "--bogus", "version")
	if code != 2 || stdout != "" || !strings.Contains(stderr, "-bogus") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 naming the flag on stderr", code, stdout, stderr)
	}
}

func TestServeHelpDoesNotStartTheDaemon(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
	}{
		{[]string{"serve", "-h"}, 0},
		{[]string{"serve", "--help"}, 0},
		{[]string{"serve", "extra"}, 2},
	} {
		code, _, stderr, dataDir := runInProcess(t, tc.args...)
		if code != tc.code {
			t.Errorf("inferd %v: exit %d (stderr %q), want %d", tc.args, code, stderr, tc.code)
		}
		if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
			t.Errorf("inferd %v started the daemon: it created %s", tc.args, dataDir)
		}
	}
}

// A stray word after a command that takes none is a usage error, not
// silently ignored (it is usually a mistyped flag or subcommand).
func TestCommandsWithoutArgumentsRefuseStrayWords(t *testing.T) {
	for _, args := range [][]string{{"version", "extra"}, {"doctor", "extra"}, {"project", "list", "extra"}, {"key", "list", "extra"}, {"apply", "-f", "x.yaml", "extra"}} {
		code, stdout, stderr, _ := runInProcess(t, args...)
		if code != 2 || !strings.Contains(stderr, `takes no arguments, got "extra"`) {
			t.Errorf("inferd %v: exit %d, stdout %q, stderr %q; want exit 2 naming the stray word", args, code, stdout, stderr)
		}
	}
}
