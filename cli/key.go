package cli

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"inferd/store"
)

// defaultAdminTeam owns an admin key created without --team: every key
// belongs to a team, but an admin key's team grants it nothing.
const defaultAdminTeam = "admin"

// keyCommand creates, lists and revokes API keys.
type keyCommand struct{ env *env }

func (c *keyCommand) Usage() string {
	return `Usage:
  inferd [global flags] key create [--team T] [--admin] [--scope infer,read,manage]
                                   [--expires 30d] [--projects a,b]
  inferd [global flags] key list [--team T]
  inferd [global flags] key revoke ID

key create makes an API key and prints its secret on the last line; the
secret is shown only this once (inferd keeps a hash).
  --team T   the team that owns the key, created if missing; a team key sees
             that team's projects, calls and logs
  --admin    an admin key: every team's projects, calls and logs (it is
             kept under a team called admin unless --team names another,
             which team list does not show while it holds only admin keys)
  --scope S  what a team key may do, comma-separated (default all three):
             infer (start and check calls), read (GET projects, status),
             manage (PUT projects)
  --expires D  the key stops working after D: days (30d) or a duration (12h)
  --projects P only these projects of the team (comma-separated)

key list prints every key, or one team's with --team, with its scope, expiry
and projects. key revoke ID stops the key at once (IDs are in key list).
`
}

type keyView struct {
	ID          string             `json:"id"`
	TeamID      string             `json:"teamId"`
	Scope       store.KeyScope     `json:"scope"`
	Permissions []store.Permission `json:"permissions"`
	Expires     time.Time          `json:"expires"`
	Projects    []string           `json:"projects"`
	Created     time.Time          `json:"created"`
	Revoked     time.Time          `json:"revoked"`
}

// scopeText is the key's reach as key list shows it: "admin", or its
// permissions.
func (k keyView) scopeText() string {
	return store.APIKey{Scope: k.Scope, KeyLimits: store.KeyLimits{Permissions: k.Permissions}}.ScopeText()
}

func (c *keyCommand) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "key", args,
		subcommand{"create", c.create}, subcommand{"list", c.list}, subcommand{"revoke", c.revoke})
}

func (c *keyCommand) create(ctx context.Context, args []string) error {
	fs := subFlags("key create")
	team := fs.String("team", "", "team that owns the key (created if missing)")
	admin := fs.Bool("admin", false, "admin scope: every team's projects and calls")
	scopeFlag := fs.String("scope", "", "infer,read,manage (default all three)")
	expires := fs.String("expires", "", "lifetime: 30d or 12h (default never)")
	projects := fs.String("projects", "", "only these projects, comma-separated")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	req := map[string]any{}
	perms, err := store.ParsePermissions(*scopeFlag)
	if err != nil {
		return fmt.Errorf("%w: --scope: %v", errUsage, err)
	}
	if len(perms) > 0 {
		req["permissions"] = perms
	}
	if *expires != "" {
		d, err := parseLifetime(*expires)
		if err != nil {
			return fmt.Errorf("%w: --expires: %v", errUsage, err)
		}
		req["expires"] = time.Now().Add(d).UTC()
	}
	if *projects != "" {
		req["projects"] = strings.Split(*projects, ",")
	}
	if *admin && len(req) > 0 {
		return fmt.Errorf("%w: an --admin key reaches everything: it takes no --scope, --expires or --projects", errUsage)
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
	err = c.env.withAdmin(func(a *adminClient) error {
		req["team"], req["scope"] = *team, scope
		return a.call(ctx, "POST", "/admin/keys", req, &out)
	})
	if err != nil {
		return err
	}
	if out.Key.Scope == store.ScopeAdmin {
		fmt.Fprintf(c.env.stdout, "Created admin key %s: it reaches every team's projects, calls and logs. Keep the secret below: it is shown only once.\n", out.Key.ID)
	} else {
		fmt.Fprintf(c.env.stdout, "Created %s key %s for team %s. Keep the secret below: it is shown only once.\n", out.Key.scopeText(), out.Key.ID, out.Key.TeamID)
	}
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
	fmt.Fprintln(tw, "ID\tTEAM\tSCOPE\tPROJECTS\tCREATED\tEXPIRES\tSTATUS")
	now := time.Now()
	for _, k := range out.Results {
		status, expires, projects := "active", "never", "all"
		if !k.Expires.IsZero() {
			expires = k.Expires.Format(time.RFC3339)
			if !now.Before(k.Expires) {
				status = "expired"
			}
		}
		if len(k.Projects) > 0 {
			projects = strings.Join(k.Projects, ",")
		}
		if !k.Revoked.IsZero() {
			status = "revoked " + k.Revoked.Format(time.RFC3339)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", k.ID, k.TeamID, k.scopeText(), projects,
			k.Created.Format(time.RFC3339), expires, status)
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

// parseLifetime reads a key lifetime: whole days ("30d") or a Go duration
// ("12h", "90m"); it must be positive.
func parseLifetime(s string) (time.Duration, error) {
	var d time.Duration
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n > 100*365 {
			return 0, fmt.Errorf("%q: want whole days such as 30d, or a duration such as 12h", s)
		}
		d = time.Duration(n) * 24 * time.Hour
	} else {
		var err error
		if d, err = time.ParseDuration(s); err != nil {
			return 0, fmt.Errorf("%q: want whole days such as 30d, or a duration such as 12h", s)
		}
	}
	if d <= 0 {
		return 0, fmt.Errorf("%q: must be positive", s)
	}
	return d, nil
}
