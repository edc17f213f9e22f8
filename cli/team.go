package cli

import (
	"context"
	"fmt"
	"net/url"
	"strconv"
	"text/tabwriter"

	"inferd/scheduler"
	"inferd/store"
)

// teamCommand sets and lists team quotas, and shows a team's webhook
// signing secret (team_webhook.go).
type teamCommand struct{ env *env }

func (c *teamCommand) Usage() string {
	return `Usage:
  inferd [global flags] team set TEAM [--replicas N] [--gpus N] [--cpu-slots N]
                                     [--queued-calls N] [--queued-bytes SIZE] [--running-calls N]
  inferd [global flags] team list
  inferd [global flags] team webhook-secret TEAM [--rotate]

team set replaces the team's whole quota (creating the team if missing): a
flag left out, or 0, is unlimited, so "team set TEAM" alone lifts every
limit. The quota bounds what the team's projects hold at once (replicas, GPUs,
CPU slots), run (calls at once) and queue (calls, and their input bytes, e.g.
2GiB); its projects' minReplicas together must fit in it.
team list shows each team's quota with its current use beside it (use needs
a running daemon; "-" without one).
team webhook-secret prints the team's webhook signing secret (whsec_...,
the Standard Webhooks form), drawn on first use. Receivers verify each
webhook's webhook-signature with it. --rotate draws a new one: every message
sent from then on, retries of older ones included, is signed with it.
`
}

func (c *teamCommand) Run(ctx context.Context, args []string) error {
	return runGroup(ctx, "team", args, subcommand{"set", c.set}, subcommand{"list", c.list},
		subcommand{"webhook-secret", c.webhookSecret})
}

func (c *teamCommand) set(ctx context.Context, args []string) error {
	fs := subFlags("team set")
	var q store.Quota
	fs.IntVar(&q.Replicas, "replicas", 0, "replicas at once, all projects (0 = unlimited)")
	fs.IntVar(&q.GPUs, "gpus", 0, "GPUs held at once (0 = unlimited)")
	fs.IntVar(&q.CPUSlots, "cpu-slots", 0, "CPU slots held at once (0 = unlimited)")
	fs.IntVar(&q.QueuedCalls, "queued-calls", 0, "calls waiting (0 = unlimited)")
	bytes := fs.String("queued-bytes", "", "input bytes waiting, e.g. 2GiB (unset = unlimited)")
	fs.IntVar(&q.RunningCalls, "running-calls", 0, "calls running at once (0 = unlimited)")
	rest, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(rest) != 1 {
		return fmt.Errorf("%w: team set needs exactly one TEAM", errUsage)
	}
	if *bytes != "" {
		if q.QueuedBytes, err = store.ParseBytes(*bytes); err != nil {
			return fmt.Errorf("%w: --queued-bytes: %v", errUsage, err)
		}
	}
	var out struct {
		Team     store.Team `json:"team"`
		Warnings []string   `json:"warnings"`
	}
	err = c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "PUT", "/admin/teams/"+url.PathEscape(rest[0]), map[string]any{"quota": q}, &out)
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(c.env.stdout, "Team %s: quota %s.\n", out.Team.ID, out.Team.Quota)
	for _, w := range out.Warnings {
		fmt.Fprintf(c.env.stdout, "warning: %s\n", w)
	}
	return nil
}

func (c *teamCommand) list(ctx context.Context, args []string) error {
	if err := parseFlagsOnly(subFlags("team list"), args); err != nil {
		return err
	}
	var out struct {
		Results []struct {
			ID    string                `json:"id"`
			Quota store.Quota           `json:"quota"`
			Use   *scheduler.TeamStatus `json:"use"`
		} `json:"results"`
	}
	err := c.env.withAdmin(func(a *adminClient) error { return a.call(ctx, "GET", "/admin/teams", nil, &out) })
	if err != nil {
		return err
	}
	tw := tabwriter.NewWriter(c.env.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "TEAM\tREPLICAS\tGPUS\tCPU SLOTS\tRUNNING\tQUEUED\tQUEUED BYTES")
	for _, t := range out.Results {
		u := t.Use
		if u == nil {
			u = &scheduler.TeamStatus{Replicas: -1, GPUs: -1, CPUSlots: -1, RunningCalls: -1, QueuedCalls: -1, QueuedBytes: -1}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.ID,
			useOf(int64(u.Replicas), int64(t.Quota.Replicas)), useOf(int64(u.GPUs), int64(t.Quota.GPUs)),
			useOf(int64(u.CPUSlots), int64(t.Quota.CPUSlots)), useOf(int64(u.RunningCalls), int64(t.Quota.RunningCalls)),
			useOf(int64(u.QueuedCalls), int64(t.Quota.QueuedCalls)), useOf(u.QueuedBytes, t.Quota.QueuedBytes))
	}
	return tw.Flush()
}

// useOf shows use against a quota: "3/8", "3/-" when unlimited, and "-"
// for a use that is unknown (no daemon runs).
func useOf(use, quota int64) string {
	u, q := "-", "-"
	if use >= 0 {
		u = strconv.FormatInt(use, 10)
	}
	if quota > 0 {
		q = strconv.FormatInt(quota, 10)
	}
	return u + "/" + q
}
