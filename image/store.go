package image

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// ErrRefused marks an archive Import will not take: what follows it in the
// error says why (a digest that does not match, a truncated archive, an
// entry that would write outside the root).
var ErrRefused = errors.New("image refused")

// ErrNotFound is an image the store does not hold.
var ErrNotFound = errors.New("image not imported")

// Store is the images kept under one directory (see the package comment).
// Its methods are safe for concurrent use, also between processes.
type Store struct {
	dir string
	// uid and gid own what the store keeps (its directories, blobs,
	// records and the top of each root): the data dir's owner, so that an
	// import by root through the CLI is the daemon's to read when it runs
	// as a user of its own (the packaged service). -1: the importer.
	uid, gid int
}

// Image is one imported image.
type Image struct {
	// ID is the digest of its config ("sha256:<hex>"), as docker's image
	// ID is: the same image saved by docker or copied by skopeo has one.
	ID string `json:"id"`
	// Manifest is the digest of the manifest it was imported from, and
	// ManifestMediaType that manifest's type (OCI's or Docker's).
	Manifest          string `json:"manifest"`
	ManifestMediaType string `json:"manifestMediaType"`
	// Chain is its layers' chain ID: the name of its root.
	Chain  string  `json:"chain"`
	Layers []Layer `json:"layers"`
	Config Config  `json:"config"`
	// Source is the file it was imported from, as given.
	Source   string    `json:"source"`
	Imported time.Time `json:"imported"`
	// RootBytes is the size of its unpacked files.
	RootBytes int64 `json:"rootBytes"`
}

// Layer is one of an image's layers.
type Layer struct {
	Digest    string `json:"digest"` // of the blob as stored
	DiffID    string `json:"diffId"` // of its uncompressed tar
	MediaType string `json:"mediaType"`
	Size      int64  `json:"size"`
}

// Config is what of an image's config a replica is started from: the
// defaults a project's command, env and dir override.
type Config struct {
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	Env        []string `json:"env,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	User       string   `json:"user,omitempty"`
}

// Bytes is what the image's blobs take on disk.
func (im Image) Bytes() int64 {
	var n int64
	for _, l := range im.Layers {
		n += l.Size
	}
	return n
}

// Short is the image's ID as people read it: the first 12 hex digits.
func (im Image) Short() string { return Short(im.ID) }

// Short cuts a digest to its first 12 hex digits.
func Short(digest string) string {
	hex := strings.TrimPrefix(digest, "sha256:")
	if len(hex) > 12 {
		hex = hex[:12]
	}
	return hex
}

var hexDigest = regexp.MustCompile(`^[0-9a-f]{64}$`)

// Open opens (making it where absent) the store in dir, and clears what
// an import that died left in its tmp/.
func Open(dir string) (*Store, error) {
	s := &Store{dir: dir, uid: -1, gid: -1}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var st unix.Stat_t
	if err := unix.Stat(filepath.Dir(dir), &st); err == nil && os.Geteuid() == 0 && st.Uid != 0 {
		s.uid, s.gid = int(st.Uid), int(st.Gid)
	}
	s.adopt(dir)
	for _, d := range []string{"blobs", "blobs/sha256", "images", "roots", "tmp", "mnt"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o700); err != nil {
			return nil, fmt.Errorf("image store: %w", err)
		}
		s.adopt(filepath.Join(dir, d))
	}
	// The roots are read by replicas' inits (root) only; 0700 keeps the
	// models' own uids out of every other image on the box.
	if err := s.locked(func() error { return removeAllIn(s.path("tmp")) }); err != nil {
		return nil, err
	}
	return s, nil
}

// Peek reads the store in dir as it is, making and clearing nothing (doctor:
// a directory that does not exist holds no image).
func Peek(dir string) *Store { return &Store{dir: dir, uid: -1, gid: -1} }

// adopt gives paths to the store's owner (see Store.uid).
func (s *Store) adopt(paths ...string) {
	if s.uid < 0 {
		return
	}
	for _, p := range paths {
		os.Lchown(p, s.uid, s.gid)
	}
}

// Dir is the store's directory.
func (s *Store) Dir() string { return s.dir }

// MountDir is an empty directory a replica's init may mount its staging
// tmpfs on (in its own mount namespace, so replicas do not see each
// other's).
func (s *Store) MountDir() string { return s.path("mnt") }

func (s *Store) path(elem ...string) string {
	return filepath.Join(append([]string{s.dir}, elem...)...)
}

func (s *Store) blobPath(digest string) string {
	return s.path("blobs", "sha256", strings.TrimPrefix(digest, "sha256:"))
}

// RootPath is where the root of an image with chain ID chain is unpacked.
func (s *Store) RootPath(chain string) string {
	return s.path("roots", strings.TrimPrefix(chain, "sha256:"))
}

// locked runs f holding the store's lock, shared with every process that
// opens the same directory.
func (s *Store) locked(f func() error) error {
	lf, err := os.OpenFile(s.path("lock"), os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	defer lf.Close()
	s.adopt(s.path("lock"))
	for {
		err = unix.Flock(int(lf.Fd()), unix.LOCK_EX)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("image store: lock: %w", err)
	}
	return f() // the lock goes with the descriptor
}

// Get returns the image ref names: its ID ("sha256:<hex>"), or a prefix of
// at least 12 hex digits of it.
func (s *Store) Get(ref string) (Image, error) {
	hex := strings.TrimPrefix(ref, "sha256:")
	if len(hex) < 12 || strings.Trim(hex, "0123456789abcdef") != "" {
		return Image{}, fmt.Errorf("%q is not an image ID (sha256: and at least 12 hex digits)", ref)
	}
	if len(hex) < 64 {
		all, err := s.List()
		if err != nil {
			return Image{}, err
		}
		var found []Image
		for _, im := range all {
			if strings.HasPrefix(strings.TrimPrefix(im.ID, "sha256:"), hex) {
				found = append(found, im)
			}
		}
		switch len(found) {
		case 0:
			return Image{}, fmt.Errorf("%w: %s", ErrNotFound, ref)
		case 1:
			return found[0], nil
		}
		return Image{}, fmt.Errorf("%s names %d images: give more of the ID", ref, len(found))
	}
	data, err := os.ReadFile(s.path("images", hex+".json"))
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, fmt.Errorf("%w: sha256:%s", ErrNotFound, hex)
	}
	if err != nil {
		return Image{}, fmt.Errorf("image store: %w", err)
	}
	var im Image
	if err := json.Unmarshal(data, &im); err != nil {
		return Image{}, fmt.Errorf("image store: read sha256:%s: %w", hex, err)
	}
	return im, nil
}

// List returns every image, oldest import first.
func (s *Store) List() ([]Image, error) {
	ents, err := os.ReadDir(s.path("images"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil // never opened: no image yet
	}
	if err != nil {
		return nil, fmt.Errorf("image store: %w", err)
	}
	var out []Image
	for _, e := range ents {
		hex, ok := strings.CutSuffix(e.Name(), ".json")
		if !ok || !hexDigest.MatchString(hex) {
			continue
		}
		im, err := s.Get("sha256:" + hex)
		if errors.Is(err, ErrNotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, err
		}
		out = append(out, im)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Imported.Before(out[j].Imported) })
	return out, nil
}

// Remove forgets the image id names (see Get) and collects what no other
// image uses (see GC). The caller has checked that no project uses it.
func (s *Store) Remove(ref string) (Image, Usage, error) {
	im, err := s.Get(ref)
	if err != nil {
		return Image{}, Usage{}, err
	}
	var freed Usage
	err = s.locked(func() error {
		if err := os.Remove(s.path("images", strings.TrimPrefix(im.ID, "sha256:")+".json")); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("image store: %w", err)
		}
		freed, err = s.gc()
		return err
	})
	return im, freed, err
}

// Usage is what the store takes on disk.
type Usage struct {
	Images    int
	Blobs     int   // blobs: layers, manifests and configs
	BlobBytes int64 // their bytes
	Roots     int   // unpacked roots
	RootBytes int64 // their files' bytes
}

// Usage says what the store holds.
func (s *Store) Usage() (Usage, error) {
	all, err := s.List()
	if err != nil {
		return Usage{}, err
	}
	u := Usage{Images: len(all)}
	blobs, err := os.ReadDir(s.path("blobs", "sha256"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return Usage{}, fmt.Errorf("image store: %w", err)
	}
	for _, b := range blobs {
		if fi, err := b.Info(); err == nil {
			u.Blobs++
			u.BlobBytes += fi.Size()
		}
	}
	seen := map[string]bool{}
	for _, im := range all {
		if !seen[im.Chain] {
			seen[im.Chain] = true
			u.Roots++
			u.RootBytes += im.RootBytes
		}
	}
	return u, nil
}

// GC removes the blobs and roots no image uses (an image removed, or an
// import that was killed after unpacking) and says what it freed.
func (s *Store) GC() (Usage, error) {
	var freed Usage
	err := s.locked(func() (err error) {
		freed, err = s.gc()
		return err
	})
	return freed, err
}

// gc is GC under the lock.
func (s *Store) gc() (Usage, error) {
	all, err := s.List()
	if err != nil {
		return Usage{}, err
	}
	blobs, roots := map[string]bool{}, map[string]bool{}
	for _, im := range all {
		roots[strings.TrimPrefix(im.Chain, "sha256:")] = true
		blobs[strings.TrimPrefix(im.ID, "sha256:")] = true
		blobs[strings.TrimPrefix(im.Manifest, "sha256:")] = true
		for _, l := range im.Layers {
			blobs[strings.TrimPrefix(l.Digest, "sha256:")] = true
		}
	}
	var freed Usage
	ents, err := os.ReadDir(s.path("blobs", "sha256"))
	if err != nil {
		return freed, fmt.Errorf("image store: %w", err)
	}
	var errs []error
	for _, e := range ents {
		if blobs[e.Name()] {
			continue
		}
		fi, _ := e.Info()
		if err := os.Remove(s.path("blobs", "sha256", e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		freed.Blobs++
		if fi != nil {
			freed.BlobBytes += fi.Size()
		}
	}
	ents, err = os.ReadDir(s.path("roots"))
	if err != nil {
		return freed, fmt.Errorf("image store: %w", err)
	}
	for _, e := range ents {
		if roots[e.Name()] {
			continue
		}
		n := treeBytes(s.path("roots", e.Name()))
		if err := removeTree(s.path("roots", e.Name()), s.path("tmp")); err != nil {
			errs = append(errs, err)
			continue
		}
		freed.Roots++
		freed.RootBytes += n
	}
	if err := errors.Join(errs...); err != nil {
		return freed, fmt.Errorf("image store: collect: %w", err)
	}
	return freed, nil
}

// removeTree removes dir by first renaming it into tmp, so that a removal
// cut short leaves no half root under its own name (Open clears tmp/).
func removeTree(dir, tmp string) error {
	doomed, err := os.MkdirTemp(tmp, "rm-")
	if err != nil {
		return err
	}
	if err := os.Rename(dir, filepath.Join(doomed, "x")); err != nil {
		os.Remove(doomed)
		return err
	}
	return removeAll(doomed)
}

// removeAllIn empties dir.
func removeAllIn(dir string) error {
	ents, err := os.ReadDir(dir)
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	var errs []error
	for _, e := range ents {
		errs = append(errs, removeAll(filepath.Join(dir, e.Name())))
	}
	return errors.Join(errs...)
}

// removeAll is os.RemoveAll for a tree whose directories an image may have
// made unwritable (0555 dirs are common): it makes each writable first.
func removeAll(dir string) error {
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.IsDir() {
			os.Chmod(p, 0o700)
		}
		return nil
	})
	return os.RemoveAll(dir)
}

// treeBytes adds up the sizes of the regular files under dir.
func treeBytes(dir string) int64 {
	var n int64
	filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n
}
