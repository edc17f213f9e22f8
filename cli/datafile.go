package cli

// Helpers for the commands that read or write data files directly (backup,
// restore, doctor).

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"inferd/internal/durable"
	"inferd/store/bolt"
)

// dataSummary is what storeSummary found in a data file.
type dataSummary struct {
	teams, projects int
	schema          int // the file's schema version
}

// storeSummary opens a data file read-only (it neither migrates nor touches
// it), counts its teams and projects, and closes it.
func storeSummary(path string) (dataSummary, error) {
	st, err := bolt.Open(path, bolt.Options{Timeout: time.Second, ReadOnly: true})
	if err != nil {
		return dataSummary{}, err
	}
	defer st.Close()
	ts, err := st.ListTeams()
	if err != nil {
		return dataSummary{}, fmt.Errorf("read teams from %s: %w", path, err)
	}
	ps, err := st.ListProjects("")
	if err != nil {
		return dataSummary{}, fmt.Errorf("read projects from %s: %w", path, err)
	}
	return dataSummary{teams: len(ts), projects: len(ps), schema: st.Migration().From}, nil
}

// writeFileSynced creates path (mode 0600, failing if it exists), fills it
// with fill, and fsyncs it. On failure the file is removed.
func writeFileSynced(path string, fill func(io.Writer) (int64, error)) (n int64, err error) {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(path)
		}
	}()
	if n, err = fill(f); err != nil {
		return n, err
	}
	if err = f.Sync(); err != nil {
		return n, fmt.Errorf("sync %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return n, fmt.Errorf("close %s: %w", path, err)
	}
	return n, nil
}

// replaceChecked makes the file dst through a temporary file beside it:
// fill writes it (fsynced), check verifies it, and only then does it take
// dst's name (the directory fsynced), so a failed or bad copy never
// replaces a good older one. It returns the bytes written.
func replaceChecked(dst string, fill func(io.Writer) (int64, error), check func(tmp string) error) (int64, error) {
	tmp := dst + ".tmp"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("remove stale %s: %w", tmp, err)
	}
	n, err := writeFileSynced(tmp, fill)
	if err != nil {
		return n, err
	}
	if err := check(tmp); err != nil {
		os.Remove(tmp)
		return n, fmt.Errorf("failed verification: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		os.Remove(tmp)
		return n, err
	}
	return n, durable.SyncDir(filepath.Dir(dst))
}

// copyFileSynced copies src to a new file dst (mode 0600), fsynced, as
// writeFileSynced makes it.
func copyFileSynced(dst, src string) (int64, error) {
	return writeFileSynced(dst, func(w io.Writer) (int64, error) {
		in, err := os.Open(src)
		if err != nil {
			return 0, err
		}
		defer in.Close()
		return io.Copy(w, in)
	})
}
