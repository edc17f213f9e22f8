package cli

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
)

// logsCommand prints a replica's log. Through the daemon's socket while it
// runs (so -f follows the live file across rotations until Ctrl-C); from the
// files when it does not, where -f has nothing to wait for.
type logsCommand struct{ env *env }

func (c *logsCommand) Usage() string {
	return `Usage:
  inferd [global flags] logs PROJECT [--replica ID] [-n LINES] [-f]

Prints what a project's replica wrote to stdout and stderr. Without
--replica, the project's most recently written log; stderr names the replica
shown.
  --replica ID  a replica id (the status page lists them)
  -n LINES      how many lines from the end (default 200)
  -f            keep printing what the replica writes, until Ctrl-C (needs a
                running daemon)
`
}

func (c *logsCommand) Run(ctx context.Context, args []string) error {
	fs := subFlags("logs")
	rid := fs.String("replica", "", "replica id (default: the project's most recently written log)")
	lines := fs.Int("n", 200, "lines to show")
	follow := fs.Bool("f", false, "keep printing what the replica writes (until Ctrl-C)")
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: logs needs one PROJECT", errUsage)
	}
	if *lines < 1 {
		return fmt.Errorf("%w: -n must be at least 1", errUsage)
	}
	return c.env.withAdmin(func(a *adminClient) error {
		q := url.Values{"lines": {strconv.Itoa(*lines)}}
		if *rid != "" {
			q.Set("replica", *rid)
		}
		if *follow && a.inProcess {
			fmt.Fprintln(c.env.stderr, "inferd: no daemon runs, so nothing is being written; showing the log without -f")
		} else if *follow {
			q.Set("follow", "1")
		}
		h, _, err := a.stream(ctx, "/admin/logs/"+url.PathEscape(pos[0])+"?"+q.Encode(), c.env.stdout)
		if err != nil && h != nil && ctx.Err() != nil {
			return nil // Ctrl-C ends -f: the reply was cut short on purpose
		}
		if err == nil && *rid == "" && h.Get("X-Inferd-Replica") != "" {
			fmt.Fprintf(c.env.stderr, "(replica %s; pick another with --replica)\n", h.Get("X-Inferd-Replica"))
		}
		return err
	})
}
