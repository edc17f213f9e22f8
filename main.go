// Command inferd is a one-box serverless inference appliance: it keeps projects,
// API keys and inference calls in an embedded bbolt file, runs model server
// processes on the machine's GPUs or CPU, and serves the Banana-compatible
// inference API, the project API, metrics and a status page.
//
// main wires the packages together; each subcommand is a small function in its
// own file (serve.go, cli_keys.go, cli_projects.go).
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Environ(), os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
