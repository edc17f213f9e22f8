package image

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// Import takes the image in the file or layout directory src into the
// store (see openSource), or finds it there already, and returns it. It
// verifies everything before anything becomes visible: an archive it
// refuses (errors.Is(err, ErrRefused)) leaves the store as it was.
func (s *Store) Import(ctx context.Context, src string) (Image, error) {
	var im Image
	err := s.locked(func() error {
		work, err := os.MkdirTemp(s.path("tmp"), "import-")
		if err != nil {
			return fmt.Errorf("image store: %w", err)
		}
		defer removeAll(work)
		im, err = s.importLocked(ctx, src, work)
		return err
	})
	if err != nil {
		return Image{}, fmt.Errorf("import %s: %w", src, err)
	}
	return im, nil
}

func (s *Store) importLocked(ctx context.Context, src, work string) (Image, error) {
	abs, err := filepath.Abs(src)
	if err != nil {
		return Image{}, err
	}
	layoutDir := filepath.Join(work, "layout")
	if err := os.Mkdir(layoutDir, 0o700); err != nil {
		return Image{}, err
	}
	var have Image
	img, known, err := openSource(abs, layoutDir, func(img v1.Image) bool {
		raw, err := img.RawConfigFile()
		if err != nil {
			return false
		}
		have, err = s.Get(fmt.Sprintf("sha256:%x", sha256.Sum256(raw)))
		return err == nil && exists(s.RootPath(have.Chain))
	})
	if err != nil {
		return Image{}, err
	}
	if known {
		return have, nil
	}
	return s.importImage(ctx, img, src, work)
}

// importImage checks img and takes it into the store (see Import); src
// names where it came from.
func (s *Store) importImage(ctx context.Context, img v1.Image, src, work string) (Image, error) {
	m, err := img.Manifest()
	if err != nil {
		return Image{}, fmt.Errorf("%w: read the manifest: %v", ErrRefused, err)
	}
	manifestDigest, err := img.Digest()
	if err != nil {
		return Image{}, fmt.Errorf("%w: read the manifest: %v", ErrRefused, err)
	}
	rawCfg, err := img.RawConfigFile()
	if err != nil {
		return Image{}, blobErr("config", m.Config.Digest, err)
	}
	id := fmt.Sprintf("sha256:%x", sha256.Sum256(rawCfg))
	if m.Config.Digest.Algorithm == "sha256" && m.Config.Digest.String() != id {
		return Image{}, fmt.Errorf("%w: config %s does not match its digest (its bytes hash to %s)", ErrRefused, m.Config.Digest, id)
	}
	cf, err := v1.ParseConfigFile(bytes.NewReader(rawCfg))
	if err != nil {
		return Image{}, fmt.Errorf("%w: read the config: %v", ErrRefused, err)
	}
	if cf.OS != "" && cf.OS != "linux" {
		return Image{}, fmt.Errorf("%w: a %s image: inferd runs linux images", ErrRefused, cf.OS)
	}
	diffIDs := cf.RootFS.DiffIDs
	if len(diffIDs) != len(m.Layers) {
		return Image{}, fmt.Errorf("%w: the manifest lists %d layers, the config %d", ErrRefused, len(m.Layers), len(diffIDs))
	}
	if have, err := s.Get(id); err == nil {
		if _, err := os.Stat(s.RootPath(have.Chain)); err == nil {
			return have, nil
		}
	}
	layers, err := img.Layers()
	if err != nil {
		return Image{}, fmt.Errorf("%w: read the layers: %v", ErrRefused, err)
	}
	im := Image{
		ID:       id,
		Manifest: manifestDigest.String(),
		Chain:    chainID(diffIDs),
		Source:   src,
		Imported: time.Now().UTC(),
		Config: Config{
			Entrypoint: cf.Config.Entrypoint,
			Cmd:        cf.Config.Cmd,
			Env:        cf.Config.Env,
			WorkingDir: cf.Config.WorkingDir,
			User:       cf.Config.User,
		},
	}
	// Every layer is checked before any is unpacked, and nothing is
	// moved into the store before all is well.
	stored := make([]v1.Layer, len(layers))
	blobs := make([]string, len(layers))
	for i, l := range layers {
		if err := ctx.Err(); err != nil {
			return Image{}, err
		}
		desc := m.Layers[i]
		if blobs[i], err = s.checkLayer(l, desc, diffIDs[i], work); err != nil {
			return Image{}, err
		}
		im.Layers = append(im.Layers, Layer{Digest: desc.Digest.String(), DiffID: diffIDs[i].String(), MediaType: string(desc.MediaType), Size: desc.Size})
		if stored[i], err = storedLayer(blobs[i], desc); err != nil {
			return Image{}, err
		}
	}
	rootDir := s.RootPath(im.Chain)
	if _, err := os.Stat(rootDir); err == nil {
		im.RootBytes = treeBytes(rootDir)
	} else {
		staging := filepath.Join(work, "root")
		if err := os.Mkdir(staging, 0o755); err != nil {
			return Image{}, err
		}
		n, err := unpack(stored, staging)
		if err != nil {
			return Image{}, err
		}
		im.RootBytes = n
		if err := os.Rename(staging, rootDir); err != nil {
			return Image{}, fmt.Errorf("image store: %w", err)
		}
		// Its top only: inside, the image's own owners stay.
		s.adopt(rootDir)
	}
	for i, l := range im.Layers {
		if dst := s.blobPath(l.Digest); blobs[i] != dst {
			if err := os.Rename(blobs[i], dst); err != nil {
				return Image{}, fmt.Errorf("image store: %w", err)
			}
			s.adopt(dst)
		}
	}
	// The manifest and config as they came, for Export (a backup) to write
	// the image again byte for byte.
	rawManifest, err := img.RawManifest()
	if err != nil {
		return Image{}, fmt.Errorf("%w: read the manifest: %v", ErrRefused, err)
	}
	for _, b := range []struct {
		digest string
		data   []byte
	}{{im.Manifest, rawManifest}, {im.ID, rawCfg}} {
		if err := s.writeBlob(b.digest, b.data, work); err != nil {
			return Image{}, err
		}
	}
	im.ManifestMediaType = string(m.MediaType)
	if im.ManifestMediaType == "" {
		mt, _ := img.MediaType()
		im.ManifestMediaType = string(mt)
	}
	if err := s.writeMeta(im, work); err != nil {
		return Image{}, err
	}
	return im, nil
}

// chainID is the OCI chain ID of layers with these diff IDs: the digest
// that names their root.
func chainID(diffIDs []v1.Hash) string {
	chain := ""
	for i, d := range diffIDs {
		if i == 0 {
			chain = d.String()
			continue
		}
		chain = fmt.Sprintf("sha256:%x", sha256.Sum256([]byte(chain+" "+d.String())))
	}
	if chain == "" { // no layers: an empty root
		chain = fmt.Sprintf("sha256:%x", sha256.Sum256(nil))
	}
	return chain
}

// writeBlob keeps data, whose digest is digest, among the blobs.
func (s *Store) writeBlob(digest string, data []byte, work string) error {
	if got := fmt.Sprintf("sha256:%x", sha256.Sum256(data)); got != digest {
		return fmt.Errorf("%w: a blob named %s hashes to %s", ErrRefused, digest, got)
	}
	dst := s.blobPath(digest)
	if exists(dst) {
		return nil
	}
	f, err := os.CreateTemp(work, "blob-")
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(f.Name(), dst)
	}
	if err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	s.adopt(dst)
	return nil
}

// writeMeta records im, atomically.
func (s *Store) writeMeta(im Image, work string) error {
	data, err := json.MarshalIndent(im, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(work, "meta.json")
	if err := os.WriteFile(tmp, data, 0o600); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	dst := s.path("images", strings.TrimPrefix(im.ID, "sha256:")+".json")
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("image store: %w", err)
	}
	s.adopt(dst)
	return nil
}
