package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// subFlags makes a flag set for a command. It prints nothing itself: a
// mistake comes back as a usage error, which Main prints once, and -h comes
// back as flag.ErrHelp, for which Main prints the command's own usage.
func subFlags(name string) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	return fs
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

// parseSub parses a command's flags, allowing flags after positional
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

// subcommand is one verb of a command group (key create, project list).
type subcommand struct {
	name string
	run  func(ctx context.Context, args []string) error
}

// runGroup runs the subcommand args[0] names; `inferd key help` and
// `inferd project -h` ask for the group's usage.
func runGroup(ctx context.Context, group string, args []string, subs ...subcommand) error {
	if len(args) == 0 {
		names := make([]string, len(subs))
		for i, s := range subs {
			names[i] = s.name
		}
		return fmt.Errorf("%w: %s needs a subcommand: %s", errUsage, group, strings.Join(names, ", "))
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		return flag.ErrHelp
	}
	for _, s := range subs {
		if s.name == args[0] {
			return s.run(ctx, args[1:])
		}
	}
	return fmt.Errorf("%w: unknown %s subcommand %q", errUsage, group, args[0])
}
