package image

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// openSource reads the image in src: an OCI image layout directory, a tar
// of one (skopeo's oci-archive:, or docker save since Docker 25, which
// writes both), or an older docker save archive (manifest.json and
// <id>/layer.tar). A tar holding a layout is copied, blob files only, into
// work (a fresh directory the caller removes), since go-containerregistry
// reads layouts from a directory: first its small files (the index, the
// manifests, the config), and the layers only when have says the image is
// not one the store holds already, so that applying a manifest again does
// not copy a large archive for nothing. known reports that it was.
func openSource(src, work string, have func(v1.Image) bool) (img v1.Image, known bool, err error) {
	fi, err := os.Stat(src)
	if err != nil {
		return nil, false, fmt.Errorf("open %s: %w", src, err)
	}
	if fi.IsDir() {
		img, err := openLayout(src)
		return img, false, err
	}
	hasIndex, hasManifest, err := copyLayoutFiles(src, work, smallBlob)
	if err != nil {
		return nil, false, err
	}
	switch {
	case hasIndex:
		if img, err := openLayout(work); err == nil && have(img) {
			return img, true, nil
		}
		if _, _, err := copyLayoutFiles(src, work, 0); err != nil {
			return nil, false, err
		}
		img, err := openLayout(work)
		return img, false, err
	case hasManifest:
		img, err := tarball.ImageFromPath(src, nil)
		if err != nil {
			return nil, false, fmt.Errorf("%w: docker archive %s: %v", ErrRefused, src, err)
		}
		return img, false, nil
	}
	return nil, false, fmt.Errorf("%w: %s is neither an OCI image layout (no index.json) nor a docker save archive (no manifest.json)", ErrRefused, src)
}

// smallBlob is the size up to which copyLayoutFiles' first pass copies a
// blob: indexes, manifests and configs are a few KiB, layers are larger
// (a smaller layer is copied at once, which changes nothing).
const smallBlob = 1 << 20

// openLayout picks the image of this machine's platform from the OCI
// layout in dir, verifying each index and manifest on the way against the
// digest it was reached by.
func openLayout(dir string) (v1.Image, error) {
	if _, err := os.Stat(filepath.Join(dir, "index.json")); err != nil {
		return nil, fmt.Errorf("%w: %s is not an OCI image layout: %v", ErrRefused, dir, err)
	}
	idx, err := layout.ImageIndexFromPath(dir)
	if err != nil {
		return nil, fmt.Errorf("%w: read the layout's index: %v", ErrRefused, err)
	}
	return pickImage(idx, 0)
}

// pickImage chooses, in idx, the image for linux on this machine's
// architecture (or the only one, when the index says no platform).
func pickImage(idx v1.ImageIndex, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, fmt.Errorf("%w: indexes nested too deep", ErrRefused)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, fmt.Errorf("%w: read the index: %v", ErrRefused, err)
	}
	var seen []string
	for _, d := range im.Manifests {
		if d.Platform != nil && !(d.Platform.OS == "linux" && d.Platform.Architecture == runtime.GOARCH) {
			seen = append(seen, d.Platform.OS+"/"+d.Platform.Architecture)
			continue
		}
		switch {
		case d.MediaType.IsIndex():
			inner, err := idx.ImageIndex(d.Digest)
			if err != nil {
				return nil, blobErr("index", d.Digest, err)
			}
			if err := verifyRaw("index", d.Digest, inner.RawManifest); err != nil {
				return nil, err
			}
			return pickImage(inner, depth+1)
		case d.MediaType.IsImage():
			img, err := idx.Image(d.Digest)
			if err != nil {
				return nil, blobErr("manifest", d.Digest, err)
			}
			if err := verifyRaw("manifest", d.Digest, img.RawManifest); err != nil {
				return nil, err
			}
			return img, nil
		}
	}
	if len(seen) > 0 {
		return nil, fmt.Errorf("%w: no linux/%s image in the archive (it has %s)", ErrRefused, runtime.GOARCH, strings.Join(seen, ", "))
	}
	return nil, fmt.Errorf("%w: the archive's index lists no image", ErrRefused)
}

// verifyRaw checks the bytes raw returns against want.
func verifyRaw(what string, want v1.Hash, raw func() ([]byte, error)) error {
	b, err := raw()
	if err != nil {
		return blobErr(what, want, err)
	}
	got, _, err := v1.SHA256(bytes.NewReader(b))
	if err != nil {
		return err
	}
	if got != want {
		return fmt.Errorf("%w: %s %s does not match its digest (its bytes hash to %s)", ErrRefused, what, want, got)
	}
	return nil
}

// blobErr says what reading a blob found; a missing one means the archive
// or layout is incomplete.
func blobErr(what string, h v1.Hash, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("%w: %s %s is missing from the archive (truncated or incomplete?)", ErrRefused, what, h)
	}
	return fmt.Errorf("%w: read %s %s: %v", ErrRefused, what, h, err)
}

// layoutFile is what of a tar copyLayoutFiles copies: an OCI layout's
// files, nothing else, so that no name in the archive picks where a file
// is written.
var layoutFile = regexp.MustCompile(`^(oci-layout|index\.json|blobs/(sha256/[0-9a-f]{64}|sha512/[0-9a-f]{128}))$`)

// copyLayoutFiles copies the OCI layout files of the tar at src into dir,
// those of at most maxSize bytes (0: all; one copied before is left as it
// is), and says whether it has an index.json and a docker manifest.json. A
// tar cut short is refused.
func copyLayoutFiles(src, dir string, maxSize int64) (hasIndex, hasManifest bool, err error) {
	f, err := os.Open(src)
	if err != nil {
		return false, false, fmt.Errorf("open %s: %w", src, err)
	}
	defer f.Close()
	tr := tar.NewReader(f)
	entries := 0
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			if entries == 0 {
				return false, false, fmt.Errorf("%w: %s is not a tar archive or layout directory: %v", ErrRefused, src, err)
			}
			return false, false, fmt.Errorf("%w: %s is truncated or damaged: %v", ErrRefused, src, err)
		}
		entries++
		name := path.Clean(strings.TrimPrefix(h.Name, "./"))
		if name == "manifest.json" {
			hasManifest = true
		}
		if h.Typeflag != tar.TypeReg || !layoutFile.MatchString(name) {
			continue
		}
		if name == "index.json" {
			hasIndex = true
		}
		dst := filepath.Join(dir, filepath.FromSlash(name))
		if maxSize > 0 && h.Size > maxSize {
			continue // a layer: the second pass's, if any
		}
		if _, err := os.Lstat(dst); maxSize == 0 && err == nil {
			continue // the first pass's
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return false, false, err
		}
		out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return false, false, fmt.Errorf("%w: %s: %v", ErrRefused, name, err)
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return false, false, fmt.Errorf("%w: %s is truncated or damaged: %s: %v", ErrRefused, src, name, err)
		}
	}
	if entries == 0 {
		return false, false, fmt.Errorf("%w: %s is empty", ErrRefused, src)
	}
	return hasIndex, hasManifest, nil
}

// isLayer reports whether mt is a layer media type Import unpacks.
func isLayer(mt types.MediaType) bool {
	switch mt {
	case types.DockerLayer, types.DockerUncompressedLayer, types.OCILayer, types.OCIUncompressedLayer,
		types.OCILayerZStd:
		return true
	}
	return false
}
