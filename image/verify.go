package image

import (
	"archive/tar"
	"crypto/sha256"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/partial"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// entryProblem says why a layer's tar entry may not be unpacked, or "".
// Names are relative to the image's root; a link may not lead out of it
// (a symbolic link's relative target, resolved from its own directory; a
// hard link's target, which tar names from the root); device nodes would
// hand a model a host device.
func entryProblem(h *tar.Header) string {
	name := strings.TrimPrefix(h.Name, "./")
	if escapes(name) {
		return fmt.Sprintf("entry %q writes outside the image's root", h.Name)
	}
	switch h.Typeflag {
	case tar.TypeSymlink:
		if !path.IsAbs(h.Linkname) && escapes(path.Join(path.Dir(path.Clean(name)), h.Linkname)) {
			return fmt.Sprintf("symbolic link %q -> %q leads outside the image's root", h.Name, h.Linkname)
		}
	case tar.TypeLink:
		if escapes(strings.TrimPrefix(h.Linkname, "./")) {
			return fmt.Sprintf("hard link %q -> %q leads outside the image's root", h.Name, h.Linkname)
		}
	case tar.TypeChar, tar.TypeBlock:
		return fmt.Sprintf("entry %q is a device node (%d:%d)", h.Name, h.Devmajor, h.Devminor)
	}
	return ""
}

// escapes reports whether the slash-separated name, taken from the root,
// is absolute or climbs above it.
func escapes(name string) bool {
	if path.IsAbs(name) || strings.Contains(name, "\\") {
		return true
	}
	c := path.Clean(name)
	return c == ".." || strings.HasPrefix(c, "../")
}

// checkLayer copies layer l of an image into tmp, checking its bytes
// against the manifest's digest and size, its uncompressed tar against the
// config's diff ID, and every entry (entryProblem), and returns where the
// checked blob is: in tmp, or in the store's blobs, where one already
// stored was checked when it came.
func (s *Store) checkLayer(l v1.Layer, desc v1.Descriptor, diffID v1.Hash, tmp string) (string, error) {
	if !isLayer(desc.MediaType) {
		return "", fmt.Errorf("%w: layer %s has media type %q, which is not a layer inferd can unpack", ErrRefused, desc.Digest, desc.MediaType)
	}
	if p := s.blobPath(desc.Digest.String()); exists(p) {
		return p, nil
	}
	rc, err := l.Compressed()
	if err != nil {
		return "", blobErr("layer", desc.Digest, err)
	}
	defer rc.Close()
	f, err := os.CreateTemp(tmp, "blob-")
	if err != nil {
		return "", err
	}
	h := sha256.New()
	n, err := io.Copy(f, io.TeeReader(rc, h))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return "", fmt.Errorf("%w: layer %s is truncated or damaged: %v", ErrRefused, desc.Digest, err)
	}
	if got := digestOf(h); got != desc.Digest.String() {
		return "", fmt.Errorf("%w: layer %s does not match its digest (its bytes hash to %s)", ErrRefused, desc.Digest, got)
	}
	if desc.Size > 0 && n != desc.Size {
		return "", fmt.Errorf("%w: layer %s is %d bytes, its manifest says %d", ErrRefused, desc.Digest, n, desc.Size)
	}
	if err := scanLayer(f.Name(), desc, diffID); err != nil {
		return "", err
	}
	return f.Name(), nil
}

func exists(p string) bool {
	_, err := os.Stat(p)
	return err == nil
}

// scanLayer reads the stored blob at p uncompressed: its bytes must hash
// to diffID, and each entry must pass entryProblem.
func scanLayer(p string, desc v1.Descriptor, diffID v1.Hash) error {
	l, err := storedLayer(p, desc)
	if err != nil {
		return err
	}
	rc, err := l.Uncompressed()
	if err != nil {
		return fmt.Errorf("%w: layer %s: %v", ErrRefused, desc.Digest, err)
	}
	defer rc.Close()
	h := sha256.New()
	tr := tar.NewReader(io.TeeReader(rc, h))
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("%w: layer %s is not a whole tar: %v", ErrRefused, desc.Digest, err)
		}
		if why := entryProblem(hdr); why != "" {
			return fmt.Errorf("%w: layer %s: %s", ErrRefused, desc.Digest, why)
		}
	}
	// What follows the tar's end marker counts too: the diff ID covers it.
	if _, err := io.Copy(io.Discard, io.TeeReader(rc, h)); err != nil {
		return fmt.Errorf("%w: layer %s is truncated or damaged: %v", ErrRefused, desc.Digest, err)
	}
	if got := digestOf(h); got != diffID.String() {
		return fmt.Errorf("%w: layer %s unpacks to %s, but the image's config says %s", ErrRefused, desc.Digest, got, diffID)
	}
	return nil
}

func digestOf(h hash.Hash) string { return fmt.Sprintf("sha256:%x", h.Sum(nil)) }

// blobLayer is a layer blob in the store, for go-containerregistry's
// partial.CompressedToLayer, which decompresses it (gzip, zstd or none,
// by its first bytes).
type blobLayer struct {
	path string
	desc v1.Descriptor
}

func (b blobLayer) Digest() (v1.Hash, error)            { return b.desc.Digest, nil }
func (b blobLayer) Size() (int64, error)                { return b.desc.Size, nil }
func (b blobLayer) MediaType() (types.MediaType, error) { return b.desc.MediaType, nil }
func (b blobLayer) Compressed() (io.ReadCloser, error)  { return os.Open(b.path) }

func storedLayer(p string, desc v1.Descriptor) (v1.Layer, error) {
	l, err := partial.CompressedToLayer(blobLayer{path: p, desc: desc})
	if err != nil {
		return nil, fmt.Errorf("layer %s: %w", desc.Digest, err)
	}
	return l, nil
}
