package cli

import (
	"context"
	"fmt"
	"io"
	"os"

	"inferd/image"
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
When this node holds images (inferd image list), they go beside it to
FILE.images, an OCI image layout (restore imports them again).
  --force   overwrite FILE (and FILE.images) if it exists
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
	for _, p := range []string{dst, imagesBackup(dst)} {
		if _, err := os.Stat(p); err == nil && !*force {
			return fmt.Errorf("%s exists; pass --force to overwrite it", p)
		}
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
	return c.backupImages(dst)
}

// imagesBackup is where a backup FILE's images go.
func imagesBackup(file string) string { return file + ".images" }

// backupImages exports this node's images beside the backup dst, when it
// holds any: into a fresh directory, which then takes the name (an older
// one goes only once the new one is whole).
func (c *backupCommand) backupImages(dst string) error {
	cfg, err := c.env.dataConfig()
	if err != nil {
		return err
	}
	images := image.Peek(cfg.ImageDir())
	if all, err := images.List(); err != nil || len(all) == 0 {
		return err
	}
	final := imagesBackup(dst)
	tmp := fmt.Sprintf("%s.tmp-%d", final, os.Getpid())
	n, err := images.Export(tmp)
	if err == nil {
		if err = os.RemoveAll(final); err == nil {
			err = os.Rename(tmp, final)
		}
	}
	if err != nil {
		os.RemoveAll(tmp)
		return fmt.Errorf("backup: images: %w (the data file's backup %s is whole)", err, dst)
	}
	fmt.Fprintf(c.env.stdout, "%d images written to %s\n", n, final)
	return nil
}
