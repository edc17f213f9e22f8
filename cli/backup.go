package cli

import (
	"context"
	"fmt"
	"io"
	"os"
)

// backupCommand writes a consistent snapshot of the data file, also while
// the daemon serves.
type backupCommand struct{ env *env }

func (c *backupCommand) Usage() string {
	return `Usage:
  inferd [global flags] backup [--force] FILE

Writes a consistent snapshot of the data file (projects, teams, key hashes,
calls) to FILE, while the daemon serves or not. The copy is checked before it
takes FILE's name, so a failed backup never replaces a good older one.
  --force   overwrite FILE if it exists
`
}

func (c *backupCommand) Run(ctx context.Context, args []string) error {
	fs := subFlags("backup")
	force := fs.Bool("force", false, "overwrite FILE if it exists")
	pos, err := parseSub(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: backup needs exactly one FILE", errUsage)
	}
	dst := pos[0]
	if _, err := os.Stat(dst); err == nil && !*force {
		return fmt.Errorf("%s exists; pass --force to overwrite it", dst)
	}
	var (
		n   int64
		sum dataSummary
	)
	err = c.env.withAdmin(func(a *adminClient) error {
		var err error
		n, err = replaceChecked(dst, func(w io.Writer) (int64, error) {
			_, n, err := a.stream(ctx, "/admin/backup", w)
			return n, err
		}, func(tmp string) (err error) {
			sum, err = storeSummary(tmp)
			return err
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	fmt.Fprintf(c.env.stdout, "backup written to %s (%d bytes, %d teams, %d projects)\n", dst, n, sum.teams, sum.projects)
	return nil
}
