package cli

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"inferd/manifest"
)

// applyCommand creates or updates teams and projects from a manifest.
type applyCommand struct{ env *env }

func (c *applyCommand) Usage() string {
	return `Usage:
  inferd [global flags] apply -f MANIFEST.yaml

Creates or updates the teams and projects the manifest lists (see
examples/projects.yaml); projects it does not list are left alone. A teams:
entry sets that team's whole quota (an absent field is unlimited). It refuses
the manifest when a team's projects' minReplicas go beyond its quota, or a
project beyond its caps. It prints each team's quota, one line per project
(created, updated, unchanged) and a warning for what the box cannot run as
asked (such as minimums that need more GPUs than it has). A relative dir in
the manifest is relative to the manifest's own directory.
  -f FILE   the manifest (YAML)
`
}

func (c *applyCommand) Run(ctx context.Context, args []string) error {
	fs := subFlags("apply")
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
	m, err := manifest.ParseManifest(data, filepath.Dir(abs))
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
	err = c.env.withAdmin(func(a *adminClient) error {
		return a.call(ctx, "POST", "/admin/apply", map[string]any{"teams": m.Teams, "projects": m.Projects}, &out)
	})
	if err != nil {
		return err
	}
	for _, t := range m.Teams {
		fmt.Fprintf(c.env.stdout, "team %s: quota %s\n", t.ID, t.Quota)
	}
	for _, ch := range out.Changes {
		fmt.Fprintf(c.env.stdout, "project %s (team %s): %s\n", ch.Project, ch.Team, ch.Change)
	}
	for _, w := range out.Warnings {
		fmt.Fprintf(c.env.stdout, "warning: %s\n", w)
	}
	return nil
}
