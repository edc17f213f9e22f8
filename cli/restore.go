package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"syscall"
	"time"

	"inferd/image"
	"inferd/internal/durable"
	"inferd/store/bolt"
)

// restoreCommand replaces the data file with a backup while no daemon runs.
type restoreCommand struct{ env *env }

func (c *restoreCommand) Usage() string {
	return `Usage:
  inferd [global flags] restore FILE

Replaces the data file with the backup FILE. Stop the daemon first: restore
refuses while one serves or holds the data file. FILE must open as an inferd
data file; the current data file is moved aside (inferd.db.before-restore-TIME),
never deleted. The images backed up beside it (FILE.images) are imported
into this node's images, each checked as inferd image import checks it.
`
}

func (c *restoreCommand) Run(ctx context.Context, args []string) error {
	pos, err := parseSub(subFlags("restore"), args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return fmt.Errorf("%w: restore needs exactly one FILE", errUsage)
	}
	src := pos[0]
	cfg, err := c.env.dataConfig()
	if err != nil {
		return err
	}
	if daemonAnswers(cfg) {
		return fmt.Errorf("a daemon is serving on %s: stop the daemon first, then restore", cfg.SocketPath())
	}
	if _, err := os.Stat(src); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	sum, err := storeSummary(src)
	if errors.Is(err, bolt.ErrCorrupt) {
		// The store's advice ("restore from a backup") reads oddly when the
		// file is the backup.
		return fmt.Errorf("refusing to restore %s: not a usable inferd backup: %s; the current data file is unchanged",
			src, strings.TrimSuffix(err.Error(), "; restore from a backup"))
	}
	if err != nil {
		return fmt.Errorf("refusing to restore %s: %w", src, err)
	}
	if err := cfg.EnsureDataDir(); err != nil {
		return err
	}
	cur := cfg.StorePath()
	// Hold the data file's lock (the one bbolt takes) for the whole swap, so
	// a daemon that starts meanwhile, or one whose socket is gone, cannot
	// have the file open under us.
	if f, err := os.Open(cur); err == nil {
		defer f.Close()
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
			return fmt.Errorf("data file %s is in use by another inferd process: stop the daemon first", cur)
		}
	} else if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("restore: %w", err)
	}

	tmp := cur + ".restore-tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	n, err := copyFileSynced(tmp, src)
	if err != nil {
		return fmt.Errorf("restore: copy %s: %w", src, err)
	}
	aside := ""
	if _, err := os.Stat(cur); err == nil {
		aside = fmt.Sprintf("%s.before-restore-%d", cur, time.Now().Unix())
		if err := os.Rename(cur, aside); err != nil {
			os.Remove(tmp)
			return fmt.Errorf("restore: move the current data file aside: %w", err)
		}
	}
	// A daemon killed before its log was folded into the data file left
	// the log beside it: it belongs to that file, not to the backup (it
	// would not open, or would replay onto the wrong data). It moves with
	// the file, so that the file set aside opens whole.
	if err := moveLogAside(cur, aside); err != nil {
		os.Remove(tmp)
		return err
	}
	if err := os.Rename(tmp, cur); err != nil {
		return fmt.Errorf("restore: put %s in place (the old data file is %s): %w", tmp, aside, err)
	}
	if err := durable.SyncDir(cfg.DataDir); err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if aside != "" {
		fmt.Fprintf(c.env.stdout, "moved the current data file to %s\n", aside)
	}
	fmt.Fprintf(c.env.stdout, "restored %s to %s (%d bytes, %d teams, %d projects)\n", src, cur, n, sum.teams, sum.projects)
	if err := c.restoreImages(ctx, src, cfg.ImageDir()); err != nil {
		return err
	}
	fmt.Fprintln(c.env.stdout, "start the daemon to serve the restored data")
	return nil
}

// restoreImages imports the images backed up beside the backup src, if
// any, into the store in dir.
func (c *restoreCommand) restoreImages(ctx context.Context, src, dir string) error {
	from := imagesBackup(src)
	if fi, err := os.Stat(from); err != nil || !fi.IsDir() {
		return nil
	}
	s, err := image.Open(dir)
	if err != nil {
		return err
	}
	got, err := s.ImportAll(ctx, from)
	if err != nil {
		return fmt.Errorf("restore: the data file is restored, its images are not: %w", err)
	}
	fmt.Fprintf(c.env.stdout, "imported %d images from %s\n", len(got), from)
	return nil
}

// moveLogAside renames the write-ahead log segments of the data file cur to
// those of aside (or, when there was no data file, of a name of their own).
func moveLogAside(cur, aside string) error {
	files, err := bolt.WALFiles(cur)
	if err != nil || len(files) == 0 {
		return err
	}
	if aside == "" {
		aside = fmt.Sprintf("%s.before-restore-%d", cur, time.Now().Unix())
	}
	for _, f := range files {
		if err := os.Rename(f, aside+strings.TrimPrefix(f, cur)); err != nil {
			return fmt.Errorf("restore: move the current data file's log aside: %w", err)
		}
	}
	return nil
}
