package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"inferd/config"
	"inferd/manifest"
	"inferd/store"
)

func applyCommand(ctx context.Context, cfg config.Config, args []string, stdout, stderr io.Writer) error {
	fs := subFlags("apply", stderr)
	path := fs.String("f", "", "manifest file (YAML)")
	if err := parseFlagsOnly(fs, args); err != nil {
		return err
	}
	if *path == "" {
		return fmt.Errorf("%w: apply needs -f MANIFEST.yaml", errUsage)
	}
	data, err := os.ReadFile(*path)
	if err != nil {
		return fmt.Errorf("read manifest: %w", err)
	}
	abs, err := filepath.Abs(*path)
	if err != nil {
		return err
	}
	projects, err := manifest.Parse(data, filepath.Dir(abs))
	if err != nil {
		return fmt.Errorf("%s: %w", *path, err)
	}
	var out struct {
		Changes []struct {
			Project string `json:"project"`
			Team    string `json:"team"`
			Change  string `json:"change"`
		} `json:"changes"`
		Warnings []string `json:"warnings"`
	}
	err = withAdmin(cfg, func(c *adminClient) error {
		return c.call(ctx, "POST", "/admin/apply", map[string]any{"projects": projects}, &out)
	})
	if err != nil {
		return err
	}
	for _, ch := range out.Changes {
		fmt.Fprintf(stdout, "project %s (team %s): %s\n", ch.Project, ch.Team, ch.Change)
	}
	for _, w := range out.Warnings {
		fmt.Fprintf(stdout, "warning: %s\n", w)
	}
	return nil
}

func projectCommand(ctx context.Context, cfg config.Config, args []string, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		return fmt.Errorf("%w: project needs a subcommand: list or delete", errUsage)
	}
	switch args[0] {
	case "list":
		if err := parseFlagsOnly(subFlags("project list", stderr), args[1:]); err != nil {
			return err
		}
		var out struct {
			Results []store.Project `json:"results"`
		}
		if err := withAdmin(cfg, func(c *adminClient) error { return c.call(ctx, "GET", "/admin/projects", nil, &out) }); err != nil {
			return err
		}
		tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tTEAM\tMIN\tMAX\tTIMEOUT\tIDLE\tGPUS\tPROTOCOL\tCOMMAND")
		for _, p := range out.Results {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%ds\t%ds\t%d\t%s\t%s\n", p.ID, p.TeamID, p.MinReplicas, p.MaxReplicas,
				p.InferenceTimeout, p.IdleTimeout, p.Model.GPUs, p.Model.Protocol, strings.Join(p.Model.Command, " "))
		}
		return tw.Flush()
	case "delete":
		ids, err := parseSub(subFlags("project delete", stderr), args[1:])
		if err != nil {
			return err
		}
		if len(ids) != 1 {
			return fmt.Errorf("%w: project delete needs exactly one project ID", errUsage)
		}
		if err := withAdmin(cfg, func(c *adminClient) error {
			return c.call(ctx, "DELETE", "/admin/projects/"+url.PathEscape(ids[0]), nil, nil)
		}); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "Deleted project %s.\n", ids[0])
		return nil
	default:
		return fmt.Errorf("%w: unknown project subcommand %q", errUsage, args[0])
	}
}
