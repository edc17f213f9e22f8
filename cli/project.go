package cli

import (
	"context"
	"fmt"
	"net/url"
	"strings"
	"text/tabwriter"

	"inferd/store"
)

// projectCommand lists and deletes projects.
type projectCommand struct{ env *env }

func (c *projectCommand) Usage() string {
	return `Usage:
  inferd [global flags] project list
  inferd [global flags] project delete ID
  inferd [global flags] project restart ID

project list prints every team's projects with their replica bounds,
timeouts, GPUs, protocol, revision (the manifest's, or dir: and the start of
the hash of its files that apply took, then +N for N restarts) and command. project delete ID removes a project; a
running daemon stops its replicas and fails its unfinished calls with "error:
project deleted". project restart ID replaces the project's running replicas
one by one, each new one ready before an old one stops, so that no call fails
or waits for a cold boot: the way to put new code in the model's dir into
service (inferd apply does the same when the dir's files or the manifest's
revision changed). Projects are created and changed with inferd apply.
`
}

func (c *projectCommand) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "project", args, subcommand{"list", c.list}, subcommand{"delete", c.delete}, subcommand{"restart", c.restart})
}

func (c *projectCommand) list(ctx context.Context, args []string) error {
	if err := parseFlagsOnly(subFlags("project list"), args); err != nil {
		return err
	}
	var out struct {
		Results []store.Project `json:"results"`
	}
	if err := c.env.withAdmin(func(a *adminClient) error { return a.call(ctx, "GET", "/admin/projects", nil, &out) }); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTEAM\tMIN\tMAX\tTIMEOUT\tIDLE\tGPUS\tPROTOCOL\tREVISION\tCOMMAND")
	for _, p := range out.Results {
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%ds\t%ds\t%d\t%s\t%s\t%s\n", p.ID, p.TeamID, p.MinReplicas, p.MaxReplicas,
			p.InferenceTimeout, p.IdleTimeout, p.Model.GPUs, p.Model.Protocol, revisionText(p.Model), strings.Join(p.Model.Command, " "))
	}
	return tw.Flush()
}

func (c *projectCommand) delete(ctx context.Context, args []string) error {
	ids, err := parseSub(subFlags("project delete"), args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return fmt.Errorf("%w: project delete needs exactly one project ID", errUsage)
	}
	if err := c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "DELETE", "/admin/projects/"+url.PathEscape(ids[0]), nil, nil)
	}); err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "Deleted project %s.\n", ids[0])
	return nil
}

func (c *projectCommand) restart(ctx context.Context, args []string) error {
	ids, err := parseSub(subFlags("project restart"), args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return fmt.Errorf("%w: project restart needs exactly one project ID", errUsage)
	}
	if err := c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "POST", "/admin/projects/"+url.PathEscape(ids[0])+"/restart", nil, nil)
	}); err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "Restarting project %s: its replicas are replaced one by one, each new one ready before an old one stops.\n", ids[0])
	return nil
}

// revisionText is a project's revision as project list shows it: the
// manifest's, or the first 12 hex digits of its dir's hash, and how often it
// was restarted since ("dir:3f2a9c01b4e7+2"); "-" for none.
func revisionText(m store.ModelSpec) string {
	rev := m.Revision
	if hash, ok := strings.CutPrefix(rev, "dir:"); ok && len(hash) > 12 {
		rev = "dir:" + hash[:12]
	}
	if rev == "" {
		rev = "-"
	}
	if m.Restarts > 0 {
		rev += fmt.Sprintf("+%d", m.Restarts)
	}
	return rev
}
