package image

import (
	"archive/tar"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"slices"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
)

// layered is an image as mutate.Extract sees it: only its layers, read
// from the store's verified blobs.
type layered struct {
	v1.Image // nil: Extract asks only for Layers
	layers   []v1.Layer
}

func (l layered) Layers() ([]v1.Layer, error) { return l.layers, nil }

// mountPoints are made in every root, so that a replica's init can mount
// its own /proc, /dev, /sys and tmp dirs there while the root is still
// writable to it (an image built FROM scratch has none of them).
var mountPoints = []string{"proc", "dev", "sys", "tmp", "var/tmp", "etc"}

// unpack writes the image whose verified layers are layers into the empty
// directory dst: go-containerregistry's mutate.Extract flattens them
// (whiteouts and opaque directories applied, upper layers first), and
// each entry is written through an os.Root, which refuses any path or link
// that would leave dst. It returns the bytes of the files written.
func unpack(layers []v1.Layer, dst string) (int64, error) {
	root, err := os.OpenRoot(dst)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	rc := mutate.Extract(layered{layers: layers})
	defer rc.Close()
	w := &rootWriter{root: root, dirs: map[string]*tar.Header{}}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return 0, fmt.Errorf("unpack: %w", err)
		}
		if why := entryProblem(h); why != "" {
			// Checked before, when the layer was stored: a store changed
			// under us.
			return 0, fmt.Errorf("%w: %s", ErrRefused, why)
		}
		if err := w.write(h, tr); err != nil {
			return 0, fmt.Errorf("unpack %s: %w", h.Name, err)
		}
	}
	// Before finish gives the directories their owners: the importer may
	// not write into a directory it gave away.
	for _, mp := range mountPoints {
		if fi, err := root.Lstat(mp); err == nil && fi.IsDir() {
			continue
		}
		root.Remove(mp) // a file or link in its place: the mount needs a dir
		if err := root.MkdirAll(mp, 0o755); err != nil {
			return 0, fmt.Errorf("unpack: make %s: %w", mp, err)
		}
	}
	if err := w.finish(); err != nil {
		return 0, err
	}
	return w.bytes, nil
}

// rootWriter writes a flattened layer stream into a root.
type rootWriter struct {
	root  *os.Root
	bytes int64
	// dirs are the directories' headers, applied at the end: their modes
	// (a 0555 dir must take its files first) and times (writing a file
	// into a dir changes its mtime).
	dirs map[string]*tar.Header
	// links are hard links whose target came later in the stream (a lower
	// layer's file, which Extract gives after the upper layer's link).
	links []*tar.Header
	// owned are the files and links to give their owners at the end: an
	// importer with CAP_CHOWN but not CAP_FOWNER (the packaged service)
	// may no longer change the mode or times of a file it gave away, nor
	// hard-link to it.
	owned []*tar.Header
}

// fileMode is what of a header's mode is kept: permissions and the sticky
// bit. Set-user-ID and set-group-ID bits are dropped: a model runs with
// no_new_privs, where they do nothing, and nothing else should run them.
func fileMode(h *tar.Header) fs.FileMode {
	m := fs.FileMode(h.Mode) & fs.ModePerm
	if h.Mode&0o1000 != 0 {
		m |= fs.ModeSticky
	}
	return m
}

func (w *rootWriter) write(h *tar.Header, r io.Reader) error {
	name := path.Clean(h.Name)
	if name == "." {
		w.dirs["."] = h
		return nil
	}
	if dir := path.Dir(name); dir != "." {
		if err := w.root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeDir:
		if err := w.root.Mkdir(name, 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
			return err
		}
		w.dirs[name] = h
		return nil
	case tar.TypeReg: // archive/tar reads the old TypeRegA as TypeReg
		f, err := w.root.OpenFile(name, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return err
		}
		n, err := io.Copy(f, r)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return err
		}
		w.bytes += n
		w.owned = append(w.owned, h)
		return w.modeAndTimes(name, h)
	case tar.TypeSymlink:
		if err := w.root.Symlink(h.Linkname, name); err != nil {
			return err
		}
		w.owned = append(w.owned, h)
		return nil
	case tar.TypeLink:
		err := w.root.Link(path.Clean(h.Linkname), name)
		if errors.Is(err, fs.ErrNotExist) {
			w.links = append(w.links, h)
			return nil
		}
		return err
	}
	// FIFOs and the like: nothing a model needs from an image.
	return nil
}

// modeAndTimes sets a written file's (or directory's) mode and times.
func (w *rootWriter) modeAndTimes(name string, h *tar.Header) error {
	if err := w.root.Chmod(name, fileMode(h)); err != nil {
		return err
	}
	if h.ModTime.IsZero() {
		return nil
	}
	at := h.AccessTime
	if at.IsZero() {
		at = h.ModTime
	}
	return w.root.Chtimes(name, at, h.ModTime)
}

// owner gives name the header's owner, where the importer may (an
// unprivileged import keeps its own).
func (w *rootWriter) owner(name string, h *tar.Header) error {
	err := w.root.Lchown(name, h.Uid, h.Gid)
	if errors.Is(err, fs.ErrPermission) {
		return nil
	}
	return err
}

// finish makes the hard links that waited for their targets, gives files
// and links their owners, then directories their modes, times and owners,
// deepest first.
func (w *rootWriter) finish() error {
	for _, h := range w.links {
		if err := w.root.Link(path.Clean(h.Linkname), path.Clean(h.Name)); err != nil {
			return fmt.Errorf("unpack %s: %w", h.Name, err)
		}
	}
	for _, h := range w.owned {
		if err := w.owner(path.Clean(h.Name), h); err != nil {
			return fmt.Errorf("unpack %s: %w", h.Name, err)
		}
	}
	names := make([]string, 0, len(w.dirs))
	for n := range w.dirs {
		names = append(names, n)
	}
	// Longer names sort after their parents: set children first.
	sortByDepth(names)
	for _, n := range names {
		h := w.dirs[n]
		if err := w.modeAndTimes(n, h); err != nil {
			return fmt.Errorf("unpack %s: %w", h.Name, err)
		}
		if err := w.owner(n, h); err != nil {
			return fmt.Errorf("unpack %s: %w", h.Name, err)
		}
	}
	return nil
}

// sortByDepth orders names deepest first.
func sortByDepth(names []string) {
	slices.SortFunc(names, func(a, b string) int {
		return strings.Count(b, "/") - strings.Count(a, "/")
	})
}
