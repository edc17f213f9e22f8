package cli

import (
	"context"
	"fmt"
	"net/url"
	"text/tabwriter"
	"time"
)

// defaultAdminTeam owns an admin key created without --team: every key
// belongs to a team, but an admin key's team grants it nothing.
const defaultAdminTeam = "admin"

// keyCommand creates, lists and revokes API keys.
type keyCommand struct{ env *env }

func (c *keyCommand) Usage() string {
	return `Usage:
  inferd [global flags] key create [--team T] [--admin]
  inferd [global flags] key list [--team T]
  inferd [global flags] key revoke ID

key create makes an API key and prints its secret on the last line; the
secret is shown only this once (inferd keeps a hash).
  --team T   the team that owns the key, created if missing; a team key sees
             that team's projects, calls and logs
  --admin    an admin key: every team's projects, calls and logs; its team is
             "admin" unless --team names another

key list prints every key, or one team's with --team. key revoke ID stops the
key at once (IDs are in key list).
`
}

type keyView struct {
	ID      string    `json:"id"`
	TeamID  string    `json:"teamId"`
	Scope   string    `json:"scope"`
	Created time.Time `json:"created"`
	Revoked time.Time `json:"revoked"`
}

func (c *keyCommand) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "key", args,
		subcommand{"create", c.create}, subcommand{"list", c.list}, subcommand{"revoke", c.revoke})
}

func (c *keyCommand) create(ctx context.Context, args []string) error {
	fs := subFlags("key create")
	team := fs.String("team", "", "team that owns the key (created if missing)")
	admin := fs.Bool("admin", false, "admin scope: every team's projects and calls")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	scope := "team"
	if *admin {
		scope = "admin"
		if *team == "" {
			*team = defaultAdminTeam
		}
	}
	if *team == "" {
		return fmt.Errorf("%w: key create needs --team (or --admin for an admin key)", errUsage)
	}
	var out struct {
		Secret string  `json:"secret"`
		Key    keyView `json:"key"`
	}
	err := c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "POST", "/admin/keys", map[string]string{"team": *team, "scope": scope}, &out)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "Created %s key %s for team %s. Keep the secret below: it is shown only once.\n", out.Key.Scope, out.Key.ID, out.Key.TeamID)
	fmt.Fprintln(c.env.stdout, out.Secret)
	return nil
}

func (c *keyCommand) list(ctx context.Context, args []string) error {
	fs := subFlags("key list")
	team := fs.String("team", "", "only this team's keys")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	var out struct {
		Results []keyView `json:"results"`
	}
	err := c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "GET", "/admin/keys?team="+url.QueryEscape(*team), nil, &out)
	})
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tTEAM\tSCOPE\tCREATED\tSTATUS")
	for _, k := range out.Results {
		status := "active"
		if !k.Revoked.IsZero() {
			status = "revoked " + k.Revoked.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.TeamID, k.Scope, k.Created.Format(time.RFC3339), status)
	}
	return tw.Flush()
}

func (c *keyCommand) revoke(ctx context.Context, args []string) error {
	ids, err := parseSub(subFlags("key revoke"), args)
	if err != nil {
		return err
	}
	if len(ids) != 1 {
		return fmt.Errorf("%w: key revoke needs exactly one key ID (see key list)", errUsage)
	}
	err = c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "POST", "/admin/keys/"+url.PathEscape(ids[0])+"/revoke", nil, nil)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "Revoked key %s.\n", ids[0])
	return nil
}
