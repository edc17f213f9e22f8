// Command inferd is a one-box serverless inference appliance: it keeps projects,
// API keys and inference calls in an embedded bbolt file, runs model server
// processes on the machine's GPUs or CPU, and serves the Banana-compatible
// inference API, the project API, metrics and a status page.
//
// This package is the entry point and the daemon's wiring (serve.go); the
// command line and the admin commands are package cli.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"inferd/cli"
)

// Build information, set with -ldflags "-X main.version=... -X main.commit=... -X main.buildDate=...".
var (
	version   = "dev"
	commit    = "unknown"
	buildDate = "unknown"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	m := &cli.Main{
		Stdin:   os.Stdin,
		Stdout:  os.Stdout,
		Stderr:  os.Stderr,
		Environ: os.Environ(),
		Build:   cli.Build{Version: version, Commit: commit, Date: buildDate},
		Serve:   serve,
	}
	code := m.Run(ctx, os.Args[1:])
	stop()
	os.Exit(code)
}
