package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/google/go-containerregistry/pkg/v1/layout"
)

// Annotations Export writes on each image of its index: which image it is
// and where it first came from.
const (
	annotationID     = "io.inferd.image.id"
	annotationSource = "io.inferd.image.source"
)

// Export writes every image as one OCI image layout in dir, which must not
// exist yet: the blobs hard-linked where dir is on the store's file
// system, else copied, and an index listing each image's manifest. It is a
// backup any OCI tool reads (skopeo copy oci:DIR ...), and ImportAll's
// source. It returns how many images it wrote.
func (s *Store) Export(dir string) (int, error) {
	all, err := s.List()
	if err != nil {
		return 0, err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return 0, fmt.Errorf("export images: %w", err)
	}
	if err := os.MkdirAll(filepath.Join(dir, "blobs", "sha256"), 0o700); err != nil {
		return 0, fmt.Errorf("export images: %w", err)
	}
	type descriptor struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int64             `json:"size"`
		Annotations map[string]string `json:"annotations"`
	}
	index := struct {
		SchemaVersion int          `json:"schemaVersion"`
		MediaType     string       `json:"mediaType"`
		Manifests     []descriptor `json:"manifests"`
	}{SchemaVersion: 2, MediaType: "application/vnd.oci.image.index.v1+json", Manifests: []descriptor{}}
	for _, im := range all {
		digests := []string{im.Manifest, im.ID}
		for _, l := range im.Layers {
			digests = append(digests, l.Digest)
		}
		for _, d := range digests {
			if err := linkOrCopy(s.blobPath(d), filepath.Join(dir, "blobs", "sha256", strings.TrimPrefix(d, "sha256:"))); err != nil {
				return 0, fmt.Errorf("export image %s: %w", im.Short(), err)
			}
		}
		fi, err := os.Stat(s.blobPath(im.Manifest))
		if err != nil {
			return 0, fmt.Errorf("export image %s: %w", im.Short(), err)
		}
		index.Manifests = append(index.Manifests, descriptor{MediaType: im.ManifestMediaType, Digest: im.Manifest, Size: fi.Size(),
			Annotations: map[string]string{annotationID: im.ID, annotationSource: im.Source}})
	}
	data, err := json.MarshalIndent(index, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, "index.json"), data, 0o600); err != nil {
		return 0, fmt.Errorf("export images: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, "oci-layout"), []byte(`{"imageLayoutVersion": "1.0.0"}`), 0o600); err != nil {
		return 0, fmt.Errorf("export images: %w", err)
	}
	return len(all), nil
}

// linkOrCopy makes dst hold src's bytes: a hard link, or a copy across
// file systems.
func linkOrCopy(src, dst string) error {
	err := os.Link(src, dst)
	if err == nil || errors.Is(err, os.ErrExist) {
		return nil
	}
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	_, err = io.Copy(out, in)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	return err
}

// ImportAll imports every image the OCI layout in dir lists (Export's, a
// backup's), each checked as Import checks one, and returns them.
func (s *Store) ImportAll(ctx context.Context, dir string) ([]Image, error) {
	var out []Image
	err := s.locked(func() error {
		idx, err := layout.ImageIndexFromPath(dir)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrRefused, dir, err)
		}
		im, err := idx.IndexManifest()
		if err != nil {
			return fmt.Errorf("%w: %s: %v", ErrRefused, dir, err)
		}
		for _, d := range im.Manifests {
			img, err := idx.Image(d.Digest)
			if err != nil {
				return blobErr("manifest", d.Digest, err)
			}
			if err := verifyRaw("manifest", d.Digest, img.RawManifest); err != nil {
				return err
			}
			src := d.Annotations[annotationSource]
			if src == "" {
				src = dir
			}
			work, err := os.MkdirTemp(s.path("tmp"), "import-")
			if err != nil {
				return fmt.Errorf("image store: %w", err)
			}
			got, err := s.importImage(ctx, img, src, work)
			removeAll(work)
			if err != nil {
				return fmt.Errorf("image %s: %w", d.Digest, err)
			}
			out = append(out, got)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("import %s: %w", dir, err)
	}
	return out, nil
}
