package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"inferd/config"
)

// logsCommand prints a replica's log: `inferd logs PROJECT [--replica ID]
// [-n LINES] [-f]`. Through the daemon's socket while it runs (so -f follows
// the live file across rotations until Ctrl-C); from the files when it does
// not, where -f has nothing to wait for.
func logsCommand(ctx context.Context, cfg config.Config, args []string, stdout, stderr io.Writer) error {
	fs := subFlags("logs", stderr)
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
	return withAdmin(cfg, func(c *adminClient) error {
		q := url.Values{"lines": {strconv.Itoa(*lines)}}
		if *rid != "" {
			q.Set("replica", *rid)
		}
		if *follow && c.inProcess {
			fmt.Fprintln(stderr, "inferd: no daemon runs, so nothing is being written; showing the log without -f")
		} else if *follow {
			q.Set("follow", "1")
		}
		h, err := c.stream(ctx, "/admin/logs/"+url.PathEscape(pos[0])+"?"+q.Encode(), stdout)
		if err == nil && *rid == "" && h.Get("X-Inferd-Replica") != "" {
			fmt.Fprintf(stderr, "(replica %s; pick another with --replica)\n", h.Get("X-Inferd-Replica"))
		}
		return err
	})
}
