package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"text/tabwriter"
	"time"

	"inferd/config"
)

type keyView struct {
	ID      string    `json:"id"`
	TeamID  string    `json:"teamId"`
	Scope   string    `json:"scope"`
	Created time.Time `json:"created"`
	Revoked time.Time `json:"revoked"`
}

func keyCommand(ctx context.Context, cfg config.Config, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: key needs a subcommand: create, list or revoke", errUsage)
	}
	switch args[0] {
	case "create":
		fs := subFlags("key create", stderr)
		team := fs.String("team", "", "team that owns the key (created if missing)")
		admin := fs.Bool("admin", false, "admin scope: every team's projects and calls")
		if err := parseFlagsOnly(fs, args[1:]); err != nil {
			return err
		}
		if *team == "" {
			return fmt.Errorf("%w: key create needs --team", errUsage)
		}
		scope := "team"
		if *admin {
			scope = "admin"
		}
		var out struct {
			Secret string  `json:"secret"`
			Key    keyView `json:"key"`
		}
		err := withAdmin(cfg, func(c *adminClient) error {
			return c.call(ctx, "POST", "/admin/keys", map[string]string{"team": *team, "scope": scope}, &out)
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Created %s key %s for team %s. Keep the secret below: it is shown only once.\n", out.Key.Scope, out.Key.ID, out.Key.TeamID)
		fmt.Fprintln(stdout, out.Secret)
		return nil
	case "list":
		fs := subFlags("key list", stderr)
		team := fs.String("team", "", "only this team's keys")
		if err := parseFlagsOnly(fs, args[1:]); err != nil {
			return err
		}
		var out struct {
			Results []keyView `json:"results"`
		}
		err := withAdmin(cfg, func(c *adminClient) error {
			return c.call(ctx, "GET", "/admin/keys?team="+url.QueryEscape(*team), nil, &out)
		})
		if err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTEAM\tSCOPE\tCREATED\tSTATUS")
		for _, k := range out.Results {
			status := "active"
			if !k.Revoked.IsZero() {
				status = "revoked " + k.Revoked.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", k.ID, k.TeamID, k.Scope, k.Created.Format(time.RFC3339), status)
		}
		return tw.Flush()
	case "revoke":
		ids, err := parseSub(subFlags("key revoke", stderr), args[1:])
		if err != nil {
			return err
		}
		if len(ids) != 1 {
			return fmt.Errorf("%w: key revoke needs exactly one key ID (see key list)", errUsage)
		}
		err = withAdmin(cfg, func(c *adminClient) error {
			return c.call(ctx, "POST", "/admin/keys/"+url.PathEscape(ids[0])+"/revoke", nil, nil)
		})
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Revoked key %s.\n", ids[0])
		return nil
	default:
		return fmt.Errorf("%w: unknown key subcommand %q", errUsage, args[0])
	}
}
