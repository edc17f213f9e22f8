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
(created, updated with what changed and what that does, unchanged) and a
warning for what the box cannot run as asked (such as minimums that need more
GPUs than it has). A relative dir in the manifest is relative to the
manifest's own directory, as is an image:
path, which apply imports into this node's images first (inferd image
import) and stores as the image's ID.

A project's code is its dir: apply hashes its files (up to 10000 files; past
64 MiB of content a file counts by size and modification time; .git and
__pycache__ are left out), and a changed hash replaces its replicas one by
one, each new one ready before an old one stops, as a changed command or env
does. A revision: in the manifest names the version instead of the hash.

A project applied before keeps what was set through the project API (PUT
/v1/projects: an idleTimeout, a maxReplicas) wherever the manifest has not
changed since that last apply; a field the manifest changes is the
manifest's again.
  -f FILE     the manifest (YAML)
  --offline   apply to the data file itself, never through a running daemon:
              refuse, applying nothing, while a daemon serves the data dir
              (make run applies so before it starts one)
`
}

func (c *applyCommand) Run(ctx context.Context, args []string) error {
	fs := subFlags("apply")
	path := fs.String("f", "", "manifest file (YAML)")
	offline := fs.Bool("offline", false, "apply to the data file, never through a daemon")
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
	if err := importImages(ctx, c.env, m.Projects); err != nil {
		return fmt.Errorf("%s: %w: nothing was applied", *path, err)
	}
	stamped := manifest.StampRevisions(m.Projects)
	var out struct {
		Changes []struct {
			Project string `json:"project"`
			Team    string `json:"team"`
			Change  string `json:"change"`
			Detail  string `json:"detail"`
		} `json:"changes"`
		Warnings []string `json:"warnings"`
	}
	body := map[string]any{"teams": m.Teams, "projects": m.Projects}
	send := func(a *adminClient) error { return a.call(ctx, "POST", "/admin/apply", body, &out) }
	if *offline {
		err = c.applyOffline(send)
	} else {
		err = c.env.withAdmin(send)
	}
	if err != nil {
		return err
	}
	for _, t := range m.Teams {
		fmt.Fprintf(c.env.stdout, "team %s: quota %s\n", t.ID, t.Quota)
	}
	for _, ch := range out.Changes {
		line := fmt.Sprintf("project %s (team %s): %s", ch.Project, ch.Team, ch.Change)
		if ch.Detail != "" {
			line += ": " + ch.Detail
		}
		fmt.Fprintln(c.env.stdout, line)
	}
	for _, w := range append(stamped, out.Warnings...) {
		fmt.Fprintf(c.env.stdout, "warning: %s\n", w)
	}
	return nil
}

// applyOffline runs send on the data file opened here, never through a
// daemon: one that answers on the admin socket, or holds the data file,
// stops it before anything is applied.
func (c *applyCommand) applyOffline(send func(*adminClient) error) error {
	cfg, err := c.env.dataConfig()
	if err != nil {
		return err
	}
	if daemonAnswers(cfg) {
		return fmt.Errorf("an inferd daemon already serves %s (its admin socket %s answers): nothing was applied; "+
			"stop it first (Ctrl-C where it runs), or apply through it without --offline", cfg.DataDir, cfg.SocketPath())
	}
	a, err := openAdmin(cfg)
	if err != nil {
		return fmt.Errorf("%w: nothing was applied", err)
	}
	defer a.close()
	return send(a)
}
