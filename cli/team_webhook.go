package cli

import (
	"context"
	"fmt"
	"net/url"
)

// webhookSecret prints (or, with --rotate, replaces) a team's webhook
// signing secret.
func (c *teamCommand) webhookSecret(ctx context.Context, args []string) error {
	fs := subFlags("team webhook-secret")
	rotate := fs.Bool("rotate", false, "draw a new secret; the old one stops signing at once")
	teams, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(teams) != 1 {
		return fmt.Errorf("%w: team webhook-secret needs exactly one team", errUsage)
	}
	var out struct {
		Secret string `json:"secret"`
	}
	err = c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "POST", "/admin/teams/"+url.PathEscape(teams[0])+"/webhook-secret",
			map[string]bool{"rotate": *rotate}, &out)
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(c.env.stdout, out.Secret)
	return nil
}
