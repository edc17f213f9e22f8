package cli

import "context"

// teamCommand manages teams: their webhook signing secret.
type teamCommand struct{ env *env }

func (c *teamCommand) Usage() string {
	return `Usage:
  inferd [global flags] team webhook-secret TEAM [--rotate]

team webhook-secret prints the team's webhook signing secret (whsec_...,
the Standard Webhooks form), drawn on first use. Receivers verify each
webhook's webhook-signature with it. --rotate draws a new one: every message
sent from then on, retries of older ones included, is signed with it.
`
}

func (c *teamCommand) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "team", args, subcommand{"webhook-secret", c.webhookSecret})
}
