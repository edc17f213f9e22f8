package cli

import (
	"context"
	"errors"
	"io"

	"inferd/config"
)

// serveCommand runs the daemon: package main's wiring, handed in as
// Main.Serve.
type serveCommand struct {
	env   *env
	serve func(ctx context.Context, cfg config.Config, stderr io.Writer) error
}

func (c *serveCommand) Usage() string {
	return `Usage:
  inferd [global flags] serve

Runs the daemon in the foreground until SIGTERM or Ctrl-C, which drain it:
new calls are refused, running calls finish (up to shutdownTimeout), queued
calls wait for the next start. It serves the inference and project API and
the status page on listen, the admin socket in the data directory (created,
mode 0700, if missing), and the model processes. Settings come from --config,
INFERD_* variables and the global flags (docs/configuration.md).
`
}

func (c *serveCommand) Run(ctx context.Context, args []string) error {
	// Parsing first means `serve -h` prints help instead of starting a
	// daemon, and a stray word is an error.
	if err := parseFlagsOnly(subFlags("serve"), args); err != nil {
		return err
	}
	cfg, err := c.env.config()
	if err != nil {
		return err
	}
	if c.serve == nil {
		return errors.New("serve: this build has no daemon wired in")
	}
	return c.serve(ctx, cfg, c.env.stderr)
}
