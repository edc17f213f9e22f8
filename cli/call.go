package cli

import (
	"context"
	"fmt"
	"net/url"
)

// callCommand acts on one inference call.
type callCommand struct{ env *env }

func (c *callCommand) Usage() string {
	return `Usage:
  inferd [global flags] call cancel CALLID

call cancel ends a call that has not finished: a queued call never reaches
its model, a running call's request to the model is aborted. Every later
check of the call answers "error: cancelled by request". A finished call is
left as it is (exit status 1). Works whether or not the daemon runs.
`
}

func (c *callCommand) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "call", args, subcommand{"cancel", c.cancel})
}

func (c *callCommand) cancel(ctx context.Context, args []string) error {
	fs := subFlags("call cancel")
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: call cancel needs one CALLID", errUsage)
	}
	var out struct {
		ID      string `json:"id"`
		Project string `json:"projectId"`
		Message string `json:"message"`
	}
	err = c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "POST", "/admin/calls/"+url.PathEscape(pos[0])+"/cancel", nil, &out)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "Cancelled call %s of project %s.\n", out.ID, out.Project)
	return nil
}
