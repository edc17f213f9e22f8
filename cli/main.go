// Package cli is inferd's command line: global flags, then one command. Each
// command is a small type with Run(ctx, args) and Usage() in its own file
// (key.go, apply.go, doctor.go, …), in the shape of litestream's
// cmd/litestream. The daemon itself is wired in package main and handed in as
// Main.Serve, so this package starts no servers; the admin commands talk to
// the running daemon over its socket in the data directory, or run the same
// admin handler in-process on the data file when no daemon runs (admin.go).
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"inferd/config"
)

const usage = `inferd: a one-box serverless inference appliance

Usage:
  inferd [global flags] serve                       run the daemon
  inferd [global flags] key create [--team T] [--admin] [--scope infer,read,manage] [--expires 30d] [--projects a,b]
                                                    create an API key (the secret is the last line)
  inferd [global flags] key list [--team T]
  inferd [global flags] key revoke ID
  inferd [global flags] team set TEAM [--replicas N] [--gpus N] [--cpu-slots N] [--queued-calls N] [--queued-bytes SIZE] [--running-calls N]
                                                    set a team's quota (unset = unlimited)
  inferd [global flags] team list                   each team's quota, its use beside it
  inferd [global flags] team webhook-secret TEAM [--rotate]
                                                    the team's webhook signing secret
  inferd [global flags] apply -f MANIFEST.yaml      create or update teams and projects
  inferd [global flags] project list
  inferd [global flags] project delete ID
  inferd [global flags] image import FILE|list|rm ID|gc
                                                    the OCI images projects run in (docs/images.md)
  inferd [global flags] backup [--force] FILE       consistent snapshot of the data file (also while serving)
  inferd [global flags] restore FILE                replace the data file with a backup (daemon stopped)
  inferd [global flags] call cancel CALLID          cancel a queued or running call
  inferd [global flags] usage [--from T] [--to T] [--group-by project|team|hour] [--team T] [--json]
                                                    what each team and project used, as CSV
  inferd [global flags] logs PROJECT [--replica ID] [-n LINES] [-f]
                                                    a replica's output (default: the newest log)
  inferd [global flags] doctor                      check this box and say what to fix
  inferd [global flags] cluster status|members|add-member|promote-member|remove-member|backup|restore|import
                                                    operate a cluster (talks to etcd, not the daemon)
  inferd [global flags] cuda-checkpoint check|state|park|restore [PID...]
                                                    the CUDA driver's checkpoint API, as parking uses it (docs/gpu.md)
  inferd version                                    (also: inferd --version)
  inferd help [COMMAND]                             this text, or a command's (also: inferd COMMAND --help)

Global flags:
  --config FILE      YAML config file (default: $INFERD_CONFIG, else built-in defaults)
  --listen ADDR      address of the HTTP API (config key listen)
  --data-dir DIR     data directory (config key dataDir)
  --log-level LEVEL  debug, info, warn or error (config key log.level)
  --log-format FMT   auto, console or json (config key log.format)
  --version          print the version and exit

The admin commands talk to the running daemon over its socket in the data
directory, or open the data file directly when no daemon runs. With no config
file and no data directory given, they need ./data to exist: they do not
create a data file where nothing says one belongs.
`

// errUsage marks a command-line mistake: exit code 2.
var errUsage = errors.New("usage")

// Build is the version information package main sets with -ldflags.
type Build struct {
	Version, Commit, Date string
}

// Main runs one command line. Package main fills it in with the process's
// streams and the daemon's wiring; tests fill it with buffers and fakes.
type Main struct {
	Stdin          io.Reader // inferd call PROJECT - reads its inputs here; nil = none
	Stdout, Stderr io.Writer
	Environ        []string // NAME=value, as os.Environ returns them
	Build          Build
	// Serve runs the daemon until ctx ends.
	Serve func(ctx context.Context, cfg config.Config, stderr io.Writer) error
}

// command is one subcommand: Run parses its own arguments (returning
// flag.ErrHelp when they ask for help) and does the work; Usage is what
// `inferd COMMAND --help` prints.
type command interface {
	Run(ctx context.Context, args []string) error
	Usage() string
}

// env is what every command shares: the process's streams and environment
// and the global flags.
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	environ        []string
	configPath     string            // --config, else $INFERD_CONFIG; "" for none
	overrides      map[string]string // config key → value, only for flags the user set
}

// Run runs the command line args (without the program name) and returns the
// process's exit code: 0 done, 1 failed, 2 a usage mistake.
func (m *Main) Run(ctx context.Context, args []string) int {
	e, rest, err := m.parseGlobals(args)
	if err != nil {
		return m.exitCode("", err)
	}
	if len(rest) == 0 {
		fmt.Fprint(m.Stderr, usage)
		return 2
	}
	name, cmdArgs := rest[0], rest[1:]
	if name == "help" {
		return m.help(cmdArgs, e)
	}
	cmd := m.command(name, e)
	if cmd == nil {
		fmt.Fprintf(m.Stderr, "inferd: unknown command %q\n\n%s", name, usage)
		return 2
	}
	return m.exitCode(name, m.runCommand(ctx, cmd, cmdArgs))
}

// runCommand runs cmd; a request for help prints its usage to stdout.
func (m *Main) runCommand(ctx context.Context, cmd command, args []string) error {
	err := cmd.Run(ctx, args)
	if errors.Is(err, flag.ErrHelp) {
		fmt.Fprint(m.Stdout, cmd.Usage())
		return nil
	}
	return err
}

// help answers `inferd help [COMMAND]`.
func (m *Main) help(args []string, e *env) int {
	if len(args) == 0 {
		fmt.Fprint(m.Stdout, usage)
		return 0
	}
	cmd := m.command(args[0], e)
	if cmd == nil || len(args) > 1 {
		fmt.Fprintf(m.Stderr, "inferd: help takes one command name, got %q\n\n%s", args, usage)
		return 2
	}
	fmt.Fprint(m.Stdout, cmd.Usage())
	return 0
}

func (m *Main) command(name string, e *env) command {
	switch name {
	case "serve":
		return &serveCommand{env: e, serve: m.Serve}
	case "key":
		return &keyCommand{env: e}
	case "team":
		return &teamCommand{env: e}
	case "apply":
		return &applyCommand{env: e}
	case "project":
		return &projectCommand{env: e}
	case "backup":
		return &backupCommand{env: e}
	case "image":
		return &imageCommand{env: e}
	case "restore":
		return &restoreCommand{env: e}
	case "logs":
		return &logsCommand{env: e}
	case "call":
		return &callCommand{env: e}
	case "usage":
		return &usageCommand{env: e}
	case "doctor":
		return &doctorCommand{env: e}
	case "cluster":
		return &clusterCommand{env: e}
	case "version":
		return &versionCommand{env: e, build: m.Build}
	case "cuda-checkpoint":
		return &cudaCheckpointCommand{env: e}
	}
	return nil
}

// exitCode prints err, if any, and maps it to the exit code; name is the
// command that failed ("" for the global flags).
func (m *Main) exitCode(name string, err error) int {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, errUsage):
		if msg := err.Error(); msg != errUsage.Error() {
			fmt.Fprintln(m.Stderr, "inferd:", msg)
		}
		if name != "" {
			fmt.Fprintf(m.Stderr, "(inferd %s --help shows its usage)\n", name)
		}
		return 2
	default:
		fmt.Fprintln(m.Stderr, "inferd:", err)
		return 1
	}
}

// parseGlobals parses the flags before the command; it returns the command
// line from the command on. --help and --version become the help and version
// commands.
func (m *Main) parseGlobals(args []string) (*env, []string, error) {
	fs := flag.NewFlagSet("inferd", flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	fs.Usage = func() {} // printed below, to stdout for -h and stderr for a mistake
	e := &env{stdin: m.Stdin, stdout: m.Stdout, stderr: m.Stderr, environ: m.Environ, overrides: map[string]string{}}
	fs.StringVar(&e.configPath, "config", "", "YAML config file")
	showVersion := fs.Bool("version", false, "print the version and exit")
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
			return e, []string{"help"}, nil
		}
		fmt.Fprint(m.Stderr, usage)
		return e, nil, fmt.Errorf("%w: %v", errUsage, err)
	}
	fs.Visit(func(f *flag.Flag) {
		if key, ok := keys[f.Name]; ok {
			e.overrides[key] = f.Value.String()
		}
	})
	if e.configPath == "" {
		e.configPath = lookupEnv(m.Environ, "INFERD_CONFIG")
	}
	if *showVersion {
		// The version command refuses anything after it, as `version` does.
		return e, append([]string{"version"}, fs.Args()...), nil
	}
	return e, fs.Args(), nil
}

// config loads the configuration the global flags and environment name.
func (e *env) config() (config.Config, error) {
	return config.Load(e.configPath, e.environ, e.overrides)
}

// dataConfig is config for the commands that open the data file. When
// nothing names the data directory (no config file, no --data-dir, no
// $INFERD_DATADIR) and the default one does not exist here, it stops instead
// of letting the command create an empty data file: the operator ran the
// command from another directory or forgot --config, and a fresh data file
// would hide that behind "no such project" or a key nobody's daemon knows.
func (e *env) dataConfig() (config.Config, error) {
	cfg, err := e.config()
	if err != nil {
		return cfg, err
	}
	dataDirEnv := config.EnvName("dataDir")
	if e.configPath != "" || e.overrides["dataDir"] != "" || lookupEnv(e.environ, dataDirEnv) != "" {
		return cfg, nil
	}
	if _, err := os.Stat(cfg.DataDir); !errors.Is(err, os.ErrNotExist) {
		return cfg, nil
	}
	where := cfg.DataDir
	if abs, err := filepath.Abs(where); err == nil {
		where = fmt.Sprintf("%s (%s)", cfg.DataDir, abs)
	}
	return cfg, fmt.Errorf("no inferd data here: no config file was given (--config, $INFERD_CONFIG) "+
		"and the default data directory %s does not exist; "+
		"pass --config with the daemon's config file (the package installs /etc/inferd/config.yaml), "+
		"--data-dir DIR or $%s, or run from the directory that holds data/", where, dataDirEnv)
}

func lookupEnv(environ []string, name string) string {
	for i := len(environ) - 1; i >= 0; i-- {
		if len(environ[i]) > len(name) && environ[i][:len(name)+1] == name+"=" {
			return environ[i][len(name)+1:]
		}
	}
	return ""
}
