package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime/debug"

	"inferd/config"
)

// Build information, set with -ldflags "-X main.version=... -X main.commit=... -X main.buildDate=...".
var (
	version   = "dev"
	commit    = "unknown"
	buildDate = "unknown"
)

const usage = `inferd: a one-box serverless inference appliance

Usage:
  inferd [global flags] serve                       run the daemon
  inferd [global flags] key create --team T [--admin]  create an API key (the secret is the last line)
  inferd [global flags] key list [--team T]
  inferd [global flags] key revoke ID
  inferd [global flags] apply -f MANIFEST.yaml      create or update teams and projects
  inferd [global flags] project list
  inferd [global flags] project delete ID
  inferd [global flags] backup [--force] FILE       consistent snapshot of the data file (also while serving)
  inferd [global flags] restore FILE                replace the data file with a backup (daemon stopped)
  inferd [global flags] logs PROJECT [--replica ID] [-n LINES] [-f]
                                                    a replica's output (default: the newest log)
  inferd [global flags] doctor                      check this box and say what to fix
  inferd version

Global flags:
  --config FILE      YAML config file (default: $INFERD_CONFIG, else built-in defaults)
  --listen ADDR      address of the HTTP API (config key listen)
  --data-dir DIR     data directory (config key dataDir)
  --log-level LEVEL  debug, info, warn or error (config key log.level)
  --log-format FMT   auto, console or json (config key log.format)

The admin commands talk to the running daemon over its socket in the data
directory, or open the data file directly when no daemon runs.
`

// errUsage marks a command-line mistake: exit code 2.
var errUsage = errors.New("usage")

// globals are the flags accepted before the subcommand.
type globals struct {
	configPath string
	overrides  map[string]string // config key → value, only for flags the user set
}

func run(ctx context.Context, args, environ []string, stdout, stderr io.Writer) int {
	g, rest, err := parseGlobals(args, environ, stderr)
	if err != nil {
		return exitCode(err, stderr)
	}
	if len(rest) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	cmd, cmdArgs := rest[0], rest[1:]
	if cmd == "version" {
		if err := noArgs("version", cmdArgs, stderr); err != nil {
			return exitCode(err, stderr)
		}
		c, built := buildInfo()
		fmt.Fprintf(stdout, "inferd %s (commit %s, built %s, %s)\n", version, c, built, goVersion())
		return 0
	}
	if cmd == "help" || cmd == "-h" || cmd == "--help" || groupHelp(cmd, cmdArgs) {
		fmt.Fprint(stdout, usage)
		return 0
	}
	if cmd == "serve" {
		// serve takes no arguments; parsing them first means `serve -h` prints
		// help instead of starting a daemon, and a stray word is an error.
		if err := noArgs("serve", cmdArgs, stderr); err != nil {
			return exitCode(err, stderr)
		}
	}
	if cmd == "doctor" {
		// doctor loads the config itself, to report a broken one as a check.
		return exitCode(doctorCommand(ctx, g, environ, cmdArgs, stdout, stderr), stderr)
	}
	cfg, err := config.Load(g.configPath, environ, g.overrides)
	if err != nil {
		fmt.Fprintln(stderr, "inferd:", err)
		return 1
	}
	switch cmd {
	case "serve":
		err = serve(ctx, cfg, stderr)
	case "key":
		err = keyCommand(ctx, cfg, cmdArgs, stdout, stderr)
	case "apply":
		err = applyCommand(ctx, cfg, cmdArgs, stdout, stderr)
	case "project":
		err = projectCommand(ctx, cfg, cmdArgs, stdout, stderr)
	case "backup":
		err = backupCommand(ctx, cfg, cmdArgs, stdout, stderr)
	case "restore":
		err = restoreCommand(ctx, cfg, cmdArgs, stdout, stderr)
	case "logs":
		err = logsCommand(ctx, cfg, cmdArgs, stdout, stderr)
	default:
		fmt.Fprintf(stderr, "inferd: unknown command %q\n\n%s", cmd, usage)
		return 2
	}
	return exitCode(err, stderr)
}

func exitCode(err error, stderr io.Writer) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.Is(err, errUsage):
		if msg := err.Error(); msg != errUsage.Error() {
			fmt.Fprintln(stderr, "inferd:", msg)
		}
		return 2
	default:
		fmt.Fprintln(stderr, "inferd:", err)
		return 1
	}
}

func parseGlobals(args, environ []string, stderr io.Writer) (globals, []string, error) {
	fs := flag.NewFlagSet("inferd", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {} // printed below, to stdout for -h and stderr for a mistake
	g := globals{overrides: map[string]string{}}
	fs.StringVar(&g.configPath, "config", "", "YAML config file")
	// Flags that override config keys; only those the user set are applied,
	// so a flag's zero value never hides the file or the environment.
	keys := map[string]string{"listen": "listen", "data-dir": "dataDir", "log-level": "log.level", "log-format": "log.format"}
	for name := range keys {
		fs.String(name, "", "")
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			// `inferd --help` is a request, not a mistake: the usage goes to
			// stdout with exit code 0, as for `inferd help`.
			return g, []string{"help"}, nil
		}
		fmt.Fprint(stderr, usage)
		return g, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	fs.Visit(func(f *flag.Flag) {
		if key, ok := keys[f.Name]; ok {
			g.overrides[key] = f.Value.String()
		}
	})
	if g.configPath == "" {
		g.configPath = lookupEnv(environ, "INFERD_CONFIG")
	}
	return g, fs.Args(), nil
}

func lookupEnv(environ []string, name string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if len(environ[i]) > len(name) && environ[i][:len(name)+1] == name+"=" {
			return environ[i][len(name)+1:]
		}
	}
	return ""
}

func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "unknown"
}

// buildInfo returns the commit and build date set with -ldflags (make build,
// make package) or, for a plain `go build` in a checkout, the commit and
// commit time Go recorded from version control ("+dirty" when the tree had
// changes).
func buildInfo() (rev, built string) {
	rev, built = commit, buildDate
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return rev, built
	}
	vcs := map[string]string{}
	for _, s := range bi.Settings {
		vcs[s.Key] = s.Value
	}
	if rev == "unknown" && vcs["vcs.revision"] != "" {
		rev = vcs["vcs.revision"]
		if len(rev) > 12 {
			rev = rev[:12]
		}
		if vcs["vcs.modified"] == "true" {
			rev += "+dirty"
		}
	}
	if built == "unknown" && vcs["vcs.time"] != "" {
		built = vcs["vcs.time"] + " (commit time)"
	}
	return rev, built
}

// groupHelp reports whether args ask a command group (key, project) for help:
// its subcommands are listed in the usage.
func groupHelp(cmd string, args []string) bool {
	if cmd != "key" && cmd != "project" || len(args) == 0 {
		return false
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		return true
	}
	return false
}

// noArgs parses the arguments of a command that takes none.
func noArgs(name string, args []string, stderr io.Writer) error {
	fs := subFlags(name, stderr)
	fs.Usage = func() { fmt.Fprint(stderr, usage) }
	return parseFlagsOnly(fs, args)
}

// parseFlagsOnly parses the flags of a command that takes no other
// arguments: a stray word is a usage error, not silently ignored.
func parseFlagsOnly(fs *flag.FlagSet, args []string) error {
	rest, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(rest) > 0 {
		return fmt.Errorf("%w: %s takes no arguments, got %q", errUsage, fs.Name(), rest[0])
	}
	return nil
}

// subFlags makes a flag set for a subcommand that reports errors as usage errors.
func subFlags(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	return fs
}

// parseSub parses a subcommand's flags, allowing flags after positional
// arguments (`key revoke ID --x`) as users type them.
func parseSub(fs *flag.FlagSet, args []string) ([]string, error) {
	var positional []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, err
			}
			return nil, fmt.Errorf("%w: %v", errUsage, err)
		}
		args = fs.Args()
		if len(args) == 0 {
			return positional, nil
		}
		positional = append(positional, args[0])
		args = args[1:]
	}
}
