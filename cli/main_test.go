package cli

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"inferd/config"
)

// result is what one command line did.
type result struct {
	code           int
	stdout, stderr string
	served         bool // Main.Serve was called
}

// runCLI runs the command line in-process in the test's working directory,
// with environ as the whole environment, a fixed build and a Serve that only
// records that it was called.
func runCLI(t *testing.T, environ []string, args ...string) result {
	t.Helper()
	return runCLICtx(t, context.Background(), environ, args...)
}

// runCLICtx is runCLI under ctx: a command that would hang ends with it.
func runCLICtx(t *testing.T, ctx context.Context, environ []string, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	var r result
	m := &Main{
		Stdout:  &out,
		Stderr:  &errOut,
		Environ: environ,
		Build:   Build{Version: "1.2.3", Commit: "abc1234", Date: "2026-01-02T03:04:05Z"},
		Serve: func(context.Context, config.Config, io.Writer) error {
			r.served = true
			return nil
		},
	}
	r.code = m.Run(ctx, args)
	r.stdout, r.stderr = out.String(), errOut.String()
	return r
}

// runInProcess runs the command line on a fresh data dir (which it returns).
func runInProcess(t *testing.T, args ...string) (result, string) {
	t.Helper()
	dataDir := filepath.Join(t.TempDir(), "data")
	full := append([]string{"--data-dir", dataDir, "--listen", "127.0.0.1:0"}, args...)
	return runCLI(t, nil, full...), dataDir
}

func TestCLIHelpPrintsUsageAndExitsZero(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"key", "-h"}, {"project", "--help"}} {
		r, _ := runInProcess(t, args...)
		if r.code != 0 || !strings.Contains(r.stdout, "Usage:") || r.stderr != "" {
			t.Errorf("inferd %v: exit %d, stdout %q, stderr %q; want exit 0 and the usage on stdout", args, r.code, r.stdout, r.stderr)
		}
	}
}

// Every command answers --help with its own usage, not the global one: the
// lines for that command, its flags, exit 0.
func TestCommandHelpPrintsThatCommandsUsage(t *testing.T) {
	tests := []struct {
		args []string
		want []string // in the usage
	}{
		{[]string{"key", "--help"}, []string{"key create [--team T] [--admin]", "key list", "key revoke ID", "--admin"}},
		{[]string{"key", "help"}, []string{"key create"}},
		{[]string{"key", "create", "--help"}, []string{"key create [--team T] [--admin]"}},
		{[]string{"key", "revoke", "-h"}, []string{"key revoke ID"}},
		{[]string{"help", "key"}, []string{"key create"}},
		{[]string{"project", "-h"}, []string{"project list", "project delete ID"}},
		{[]string{"project", "delete", "--help"}, []string{"project delete ID"}},
		{[]string{"apply", "--help"}, []string{"apply -f MANIFEST.yaml", "-f FILE"}},
		{[]string{"backup", "--help"}, []string{"backup [--force] FILE", "--force"}},
		{[]string{"restore", "-h"}, []string{"restore FILE"}},
		{[]string{"logs", "--help"}, []string{"logs PROJECT", "--replica ID", "-n LINES", "-f "}},
		{[]string{"doctor", "--help"}, []string{"inferd [global flags] doctor"}},
		{[]string{"serve", "--help"}, []string{"inferd [global flags] serve"}},
		{[]string{"version", "--help"}, []string{"inferd version", "inferd --version"}},
		{[]string{"help", "logs"}, []string{"logs PROJECT"}},
		{[]string{"call", "cancel", "--help"}, []string{"call cancel CALLID"}},
	}
	for _, tc := range tests {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			r, _ := runInProcess(t, tc.args...)
			if r.code != 0 || r.stderr != "" || !strings.HasPrefix(r.stdout, "Usage:\n  inferd") {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit 0 and a usage on stdout", r.code, r.stdout, r.stderr)
			}
			if strings.Contains(r.stdout, "Global flags:") {
				t.Errorf("printed the global usage, want the command's own:\n%s", r.stdout)
			}
			for _, w := range tc.want {
				if !strings.Contains(r.stdout, w) {
					t.Errorf("usage lacks %q:\n%s", w, r.stdout)
				}
			}
		})
	}
}

func TestHelpForAnUnknownCommandIsAUsageError(t *testing.T) {
	r, _ := runInProcess(t, "help", "nope")
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "nope") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 naming the word", r.code, r.stdout, r.stderr)
	}
}

func TestVersionFlagAndCommandPrintTheBuild(t *testing.T) {
	for _, args := range [][]string{{"--version"}, {"-version"}, {"version"}} {
		r, _ := runInProcess(t, args...)
		want := "inferd 1.2.3 (commit abc1234, built 2026-01-02T03:04:05Z, go"
		if r.code != 0 || !strings.HasPrefix(r.stdout, want) || r.stderr != "" {
			t.Errorf("inferd %v: exit %d, stdout %q, stderr %q; want exit 0 and %q…", args, r.code, r.stdout, r.stderr, want)
		}
	}
	r, _ := runInProcess(t, "--version", "serve")
	if r.code != 2 || r.served || !strings.Contains(r.stderr, `takes no arguments, got "serve"`) {
		t.Errorf("inferd --version serve: exit %d, served %v, stderr %q; want exit 2 naming the stray word", r.code, r.served, r.stderr)
	}
}

func TestCLIUnknownGlobalFlagIsAUsageError(t *testing.T) {
	r, _ := runInProcess(t, "--bogus", "version")
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "-bogus") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 naming the flag on stderr", r.code, r.stdout, r.stderr)
	}
}

func TestUnknownCommandFlagIsAUsageErrorNamingTheCommand(t *testing.T) {
	r, _ := runInProcess(t, "key", "list", "--bogus")
	if r.code != 2 || r.stdout != "" || !strings.Contains(r.stderr, "-bogus") || !strings.Contains(r.stderr, "inferd key --help") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 2 naming the flag and inferd key --help", r.code, r.stdout, r.stderr)
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
		r, dataDir := runInProcess(t, tc.args...)
		if r.code != tc.code {
			t.Errorf("inferd %v: exit %d (stderr %q), want %d", tc.args, r.code, r.stderr, tc.code)
		}
		if r.served {
			t.Errorf("inferd %v started the daemon", tc.args)
		}
		if _, err := os.Stat(dataDir); !os.IsNotExist(err) {
			t.Errorf("inferd %v created %s", tc.args, dataDir)
		}
	}
	if r, _ := runInProcess(t, "serve"); r.code != 0 || !r.served {
		t.Errorf("inferd serve: exit %d, served %v (stderr %q); want the daemon started", r.code, r.served, r.stderr)
	}
}

// A stray word after a command that takes none is a usage error, not
// silently ignored (it is usually a mistyped flag or subcommand).
func TestCommandsWithoutArgumentsRefuseStrayWords(t *testing.T) {
	for _, args := range [][]string{{"version", "extra"}, {"doctor", "extra"}, {"project", "list", "extra"}, {"key", "list", "extra"}, {"apply", "-f", "x.yaml", "extra"}} {
		r, _ := runInProcess(t, args...)
		if r.code != 2 || !strings.Contains(r.stderr, `takes no arguments, got "extra"`) {
			t.Errorf("inferd %v: exit %d, stdout %q, stderr %q; want exit 2 naming the stray word", args, r.code, r.stdout, r.stderr)
		}
	}
}

func TestKeyCreateAdminNeedsNoTeam(t *testing.T) {
	r, dataDir := runInProcess(t, "key", "create", "--admin")
	if r.code != 0 || !strings.Contains(r.stdout, "Created admin key") || !strings.Contains(r.stdout, "reaches every team") {
		t.Fatalf("key create --admin: exit %d, stdout %q, stderr %q; want an admin key that reaches every team", r.code, r.stdout, r.stderr)
	}
	secret := strings.TrimSpace(r.stdout[strings.LastIndexByte(strings.TrimSpace(r.stdout), '\n')+1:])
	if !strings.HasPrefix(secret, "ik_") {
		t.Errorf("last line %q is not the secret", secret)
	}
	list := runCLI(t, nil, "--data-dir", dataDir, "key", "list")
	if list.code != 0 || !strings.Contains(list.stdout, "admin  ") {
		t.Errorf("key list: exit %d, stdout %q, stderr %q; want the admin key", list.code, list.stdout, list.stderr)
	}

	r, _ = runInProcess(t, "key", "create", "--admin", "--team", "ops")
	if r.code != 0 || !strings.Contains(r.stdout, "Created admin key") || !strings.Contains(r.stdout, "reaches every team") {
		t.Errorf("key create --admin --team ops: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	r, _ = runInProcess(t, "key", "create")
	if r.code != 2 || !strings.Contains(r.stderr, "needs --team") {
		t.Errorf("key create: exit %d, stderr %q; want exit 2 asking for --team", r.code, r.stderr)
	}
}

// With nothing saying where the data is and no ./data here, the admin
// commands say where they looked and stop; they create no data file.
func TestAdminCommandsWithoutConfigOrDataDirStop(t *testing.T) {
	dir := t.TempDir()
	t.Chdir(dir)
	manifest := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(manifest, []byte("projects:\n  - {id: echo, team: demo, modelKey: mk-1, command: [python3, server.py]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	commands := [][]string{
		{"key", "create", "--team", "demo"}, {"key", "create", "--admin"}, {"key", "list"}, {"key", "revoke", "k1"},
		{"apply", "-f", manifest}, {"project", "list"}, {"project", "delete", "echo"}, {"project", "restart", "echo"},
		{"call", "echo", "{}"},
		{"backup", filepath.Join(dir, "b.db")}, {"restore", manifest}, {"logs", "echo"},
	}
	abs := filepath.Join(dir, "data")
	for _, args := range commands {
		r := runCLI(t, []string{"HOME=" + dir}, args...)
		if r.code != 1 || !strings.Contains(r.stderr, "./data ("+abs+") does not exist") ||
			!strings.Contains(r.stderr, "--config") || !strings.Contains(r.stderr, "$INFERD_CONFIG") {
			t.Errorf("inferd %v: exit %d, stdout %q, stderr %q; want exit 1 saying it looked for a config and %s", args, r.code, r.stdout, r.stderr, abs)
		}
		if _, err := os.Stat(abs); !os.IsNotExist(err) {
			t.Fatalf("inferd %v created %s", args, abs)
		}
	}

	// Named data (flag or environment) or an existing ./data is used as before.
	for _, tc := range []struct {
		name    string
		environ []string
		args    []string
	}{
		{"--data-dir", nil, []string{"--data-dir", filepath.Join(dir, "flag"), "key", "list"}},
		{"INFERD_DATADIR", []string{"INFERD_DATADIR=" + filepath.Join(dir, "env")}, []string{"key", "list"}},
		{"existing ./data", nil, []string{"key", "list"}},
	} {
		if tc.name == "existing ./data" {
			if err := os.Mkdir(abs, 0o700); err != nil {
				t.Fatal(err)
			}
		}
		if r := runCLI(t, tc.environ, tc.args...); r.code != 0 || !strings.HasPrefix(r.stdout, "ID") {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want the (empty) key list", tc.name, r.code, r.stdout, r.stderr)
		}
	}
}
