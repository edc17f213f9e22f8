// Package durable writes files so that what a caller was told is written
// survives a crash: a file replaced through a temporary one, and the
// directory entry of a create, rename or remove fsynced.
package durable

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
)

// TempPrefix starts the name of every temporary file Replace makes, so that
// a reader of the directory can skip, or remove, what a crash left.
const TempPrefix = ".tmp-"

// SyncDir fsyncs a directory, so that a create, rename or remove in it
// survives a crash.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// Replace writes path through a temporary file beside it (mode 0600):
// filled, fsynced, renamed into place, the directory fsynced, so that a
// crash leaves the old content or the new, never part of it. An error of
// fill is returned as it is, path untouched and the temporary file removed.
func Replace(path string, fill func(io.Writer) error) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), TempPrefix+"*")
	if err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	defer os.Remove(tmp.Name()) // after the rename: nothing to remove
	if err := fill(tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("write %s: %w", filepath.Base(path), err)
	}
	return SyncDir(filepath.Dir(path))
}

// Remove removes path, if it is there, and fsyncs its directory.
func Remove(path string) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return SyncDir(filepath.Dir(path))
}
