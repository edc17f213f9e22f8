package manifest

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"

	"inferd/store"
)

// The bounds of a model directory's hash (DirRevision). Files past
// MaxHashedBytes of content count by size and modification time, not
// content, so that a directory of weights does not make every apply read
// them; a directory of more than MaxHashedFiles entries gets no hash at all
// (its project then rolls only on a revision, or `inferd project restart`).
const (
	MaxHashedFiles = 10000
	MaxHashedBytes = 64 << 20
)

// skipped are the names the hash leaves out, wherever they are: version
// control, and what a Python model writes into its own directory as it
// runs (which would otherwise roll it on the next apply).
var skipped = map[string]bool{".git": true, ".hg": true, ".svn": true, "__pycache__": true}

// errTooManyFiles stops DirRevision's walk.
var errTooManyFiles = errors.New("too many files")

// StampRevisions gives each project without a revision the hash of its
// model directory (DirRevision), so that an apply after its code changed
// rolls it onto the new code. It returns a warning for each directory it
// could not hash, which then rolls only when its revision or the rest of its
// spec changes; a directory that does not exist is left to apply's model
// check, which names it.
func StampRevisions(ps []store.Project) (warnings []string) {
	for i := range ps {
		m := &ps[i].Model
		if m.Revision != "" || m.Dir == "" {
			continue
		}
		if _, err := os.Stat(m.Dir); err != nil {
			continue // apply's model check names it
		}
		rev, err := DirRevision(m.Dir)
		switch {
		case err != nil:
			warnings = append(warnings, fmt.Sprintf("project %s: %v: an apply does not see its code change; set revision: in the manifest, or run inferd project restart %s after a change", ps[i].ID, err, ps[i].ID))
		default:
			m.Revision = rev
		}
	}
	return warnings
}

// DirRevision returns "dir:" and the SHA-256 of a model directory: each
// entry's relative path, type and mode, a symbolic link's target, and a
// file's content (past MaxHashedBytes of content in all, its size and
// modification time instead). Entries come in lexical order (filepath.WalkDir),
// so the hash is the same for the same tree. Names in skipped are left out.
func DirRevision(dir string) (string, error) {
	return dirRevision(dir, MaxHashedFiles, MaxHashedBytes)
}

func dirRevision(dir string, maxFiles int, maxBytes int64) (string, error) {
	h := sha256.New()
	files, hashed := 0, int64(0)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if path != dir && skipped[d.Name()] {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if files++; files > maxFiles {
			return errTooManyFiles
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		fmt.Fprintf(h, "%q %s\n", rel, info.Mode())
		switch {
		case info.Mode()&fs.ModeSymlink != 0:
			target, err := os.Readlink(path)
			if err != nil {
				return err
			}
			fmt.Fprintf(h, "-> %q\n", target)
		case !info.Mode().IsRegular():
		case hashed+info.Size() <= maxBytes:
			hashed += info.Size()
			return hashFile(h, path)
		default:
			fmt.Fprintf(h, "size %d mtime %s\n", info.Size(), strconv.FormatInt(info.ModTime().UnixNano(), 10))
		}
		return nil
	})
	switch {
	case errors.Is(err, errTooManyFiles):
		return "", fmt.Errorf("dir %s has more than %d files, too many to hash", dir, maxFiles)
	case err != nil:
		return "", fmt.Errorf("hash dir %s: %w", dir, err)
	}
	return "dir:" + hex.EncodeToString(h.Sum(nil)), nil
}

func hashFile(h io.Writer, path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.Copy(h, f)
	return err
}
