package image

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"inferd/internal/testimage"
)

// entry is one tar entry of a test layer.
type entry struct {
	name, body string
	typ        byte // tar.TypeReg when 0
	link       string
	mode       int64
}

func layerTar(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Typeflag: e.typ, Linkname: e.link, Mode: e.mode, Size: int64(len(e.body)), Format: tar.FormatPAX}
		if h.Typeflag == 0 {
			h.Typeflag = tar.TypeReg
		}
		if h.Mode == 0 {
			h.Mode = 0o644
			if h.Typeflag == tar.TypeDir {
				h.Mode = 0o755
			}
		}
		if h.Typeflag != tar.TypeReg {
			h.Size = 0
		}
		if h.Typeflag == tar.TypeChar {
			h.Devmajor, h.Devminor = 1, 3
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if h.Size > 0 {
			io.WriteString(tw, e.body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func layerOf(t *testing.T, entries ...entry) v1.Layer {
	t.Helper()
	b := layerTar(t, entries)
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
		tarball.WithMediaType(types.OCILayer))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func testImage(t *testing.T, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(img, layers...)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}

// writeLayout writes img as an OCI layout directory and returns it.
func writeLayout(t *testing.T, img v1.Image) string {
	return testimage.Layout(t, img, filepath.Join(t.TempDir(), "layout"))
}

func openStore(t *testing.T) *Store {
	t.Helper()
	s, err := Open(filepath.Join(t.TempDir(), "images"))
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// twoLayers is an image whose upper layer deletes a file (a whiteout),
// empties a directory (an opaque whiteout) and replaces a file.
func twoLayers(t *testing.T) v1.Image {
	lower := layerOf(t,
		entry{name: "app/", typ: tar.TypeDir},
		entry{name: "app/gone.txt", body: "deleted above"},
		entry{name: "app/kept.txt", body: "kept"},
		entry{name: "data/", typ: tar.TypeDir},
		entry{name: "data/old.bin", body: "hidden by opaque"},
		entry{name: "etc/", typ: tar.TypeDir},
		entry{name: "etc/version", body: "1"},
		entry{name: "bin/", typ: tar.TypeDir},
		entry{name: "bin/model", body: "#!/bin/sh\n", mode: 0o4755},
		entry{name: "bin/model-link", typ: tar.TypeLink, link: "bin/model"},
		entry{name: "lib", typ: tar.TypeSymlink, link: "usr/lib"},
	)
	upper := layerOf(t,
		entry{name: "app/.wh.gone.txt"},
		entry{name: "data/", typ: tar.TypeDir},
		entry{name: "data/.wh..wh..opq"},
		entry{name: "data/new.bin", body: "new"},
		entry{name: "etc/version", body: "2"},
	)
	return testImage(t, v1.Config{Entrypoint: []string{"/bin/model"}, Cmd: []string{"--serve"}, Env: []string{"PATH=/bin", "A=1"}, WorkingDir: "/app"}, lower, upper)
}

func TestImportUnpacksLayersWithWhiteouts(t *testing.T) {
	s := openStore(t)
	im, err := s.Import(context.Background(), writeLayout(t, twoLayers(t)))
	if err != nil {
		t.Fatal(err)
	}
	root := s.RootPath(im.Chain)
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			return "<" + errors.Unwrap(err).Error() + ">"
		}
		return string(b)
	}
	for p, want := range map[string]string{
		"app/kept.txt":   "kept",
		"app/gone.txt":   "<no such file or directory>",
		"data/old.bin":   "<no such file or directory>",
		"data/new.bin":   "new",
		"etc/version":    "2",
		"bin/model-link": "#!/bin/sh\n",
	} {
		if got := read(p); got != want {
			t.Errorf("%s: got %q, want %q", p, got, want)
		}
	}
	if l, err := os.Readlink(filepath.Join(root, "lib")); err != nil || l != "usr/lib" {
		t.Errorf("lib: got %q, %v; want a link to usr/lib", l, err)
	}
	fi, err := os.Stat(filepath.Join(root, "bin/model"))
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode()&fs.ModeSetuid != 0 || fi.Mode().Perm() != 0o755 {
		t.Errorf("bin/model mode %v: want 0755 without set-user-ID", fi.Mode())
	}
	for _, mp := range mountPoints {
		if fi, err := os.Stat(filepath.Join(root, mp)); err != nil || !fi.IsDir() {
			t.Errorf("mount point %s missing: %v", mp, err)
		}
	}
	want := Config{Entrypoint: []string{"/bin/model"}, Cmd: []string{"--serve"}, Env: []string{"PATH=/bin", "A=1"}, WorkingDir: "/app"}
	if !slices.Equal(im.Config.Entrypoint, want.Entrypoint) || !slices.Equal(im.Config.Cmd, want.Cmd) ||
		!slices.Equal(im.Config.Env, want.Env) || im.Config.WorkingDir != want.WorkingDir {
		t.Errorf("config %+v, want %+v", im.Config, want)
	}
	got, err := s.Get(im.ID[:19])
	if err != nil || got.Chain != im.Chain {
		t.Errorf("Get by short ID: %+v, %v", got, err)
	}
}

// The same image as a layout directory, an oci-archive tar and a docker
// save archive is one image, with one root.
func TestImportSameImageFromEachFormatIsOne(t *testing.T) {
	s := openStore(t)
	img := twoLayers(t)
	dir := writeLayout(t, img)
	docker := filepath.Join(t.TempDir(), "docker.tar")
	if err := tarball.WriteToFile(docker, nil, img); err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, src := range []string{dir, testimage.OCIArchive(t, img, filepath.Join(t.TempDir(), "oci.tar")), docker} {
		im, err := s.Import(context.Background(), src)
		if err != nil {
			t.Fatalf("%s: %v", src, err)
		}
		ids = append(ids, im.ID)
	}
	if ids[0] != ids[1] || ids[0] != ids[2] {
		t.Errorf("IDs %v: want one", ids)
	}
	u, err := s.Usage()
	if err != nil {
		t.Fatal(err)
	}
	if u.Images != 1 || u.Roots != 1 || u.Blobs != 4 {
		t.Errorf("usage %+v: want 1 image, 1 root, 4 blobs (2 layers, its manifest and config)", u)
	}
}

func TestImportRefusesHostileArchivesAndKeepsNothing(t *testing.T) {
	good := func(t *testing.T) string { return writeLayout(t, twoLayers(t)) }
	hostile := func(es ...entry) func(t *testing.T) string {
		return func(t *testing.T) string {
			return writeLayout(t, testImage(t, v1.Config{}, layerOf(t, entry{name: "ok.txt", body: "x"}), layerOf(t, es...)))
		}
	}
	for _, tc := range []struct {
		name string
		src  func(t *testing.T) string
		want string
	}{
		{"dot-dot name", hostile(entry{name: "../escape", body: "x"}), `entry "../escape" writes outside`},
		{"absolute name", hostile(entry{name: "/etc/cron.d/x", body: "x"}), `entry "/etc/cron.d/x" writes outside`},
		{"escaping symlink", hostile(entry{name: "a/b", typ: tar.TypeSymlink, link: "../../../etc"}), `symbolic link "a/b" -> "../../../etc" leads outside`},
		{"escaping hard link", hostile(entry{name: "shadow", typ: tar.TypeLink, link: "../etc/shadow"}), `hard link "shadow" -> "../etc/shadow" leads outside`},
		{"absolute hard link", hostile(entry{name: "shadow", typ: tar.TypeLink, link: "/etc/shadow"}), `hard link "shadow" -> "/etc/shadow" leads outside`},
		{"device node", hostile(entry{name: "dev/mem", typ: tar.TypeChar}), `entry "dev/mem" is a device node`},
		{"layer digest mismatch", func(t *testing.T) string {
			dir, img := good(t), twoLayers(t)
			corruptBlob(t, dir, layerDigest(t, img, 1))
			return dir
		}, "does not match its digest"},
		{"config digest mismatch", func(t *testing.T) string {
			dir, img := good(t), twoLayers(t)
			d, err := img.ConfigName()
			if err != nil {
				t.Fatal(err)
			}
			corruptBlob(t, dir, d)
			return dir
		}, "config sha256:"},
		{"missing layer", func(t *testing.T) string {
			dir, img := good(t), twoLayers(t)
			os.Remove(blobFile(dir, layerDigest(t, img, 0)))
			return dir
		}, "is missing from the archive"},
		{"truncated archive", func(t *testing.T) string {
			p := testimage.OCIArchive(t, twoLayers(t), filepath.Join(t.TempDir(), "image.tar"))
			fi, _ := os.Stat(p)
			os.Truncate(p, fi.Size()/2+100)
			return p
		}, "truncated"},
		{"not an archive", func(t *testing.T) string {
			p := filepath.Join(t.TempDir(), "x.tar")
			os.WriteFile(p, []byte("hello"), 0o644)
			return p
		}, "not a tar archive"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := openStore(t)
			_, err := s.Import(context.Background(), tc.src(t))
			if !errors.Is(err, ErrRefused) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want a refusal that says %q", err, tc.want)
			}
			assertEmpty(t, s)
		})
	}
}

// assertEmpty fails unless the store holds no image, blob, root or leftover.
func assertEmpty(t *testing.T, s *Store) {
	t.Helper()
	for _, d := range []string{"images", "blobs/sha256", "roots", "tmp", "mnt"} {
		ents, err := os.ReadDir(filepath.Join(s.Dir(), d))
		if err != nil {
			t.Fatal(err)
		}
		if len(ents) > 0 {
			t.Errorf("%s holds %s after a refused import", d, ents[0].Name())
		}
	}
}

func layerDigest(t *testing.T, img v1.Image, i int) v1.Hash {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ls[i].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func blobFile(dir string, d v1.Hash) string {
	return filepath.Join(dir, "blobs", d.Algorithm, d.Hex)
}

// corruptBlob flips a byte in the middle of the layout's blob d.
func corruptBlob(t *testing.T, dir string, d v1.Hash) {
	t.Helper()
	p := blobFile(dir, d)
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)/2] ^= 0xff
	if err := os.WriteFile(p, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Removing an image frees the layers only it used; a layer another image
// shares stays.
func TestRemoveCollectsUnsharedLayers(t *testing.T) {
	s := openStore(t)
	base := layerOf(t, entry{name: "base.txt", body: "shared"})
	a, err := s.Import(context.Background(), writeLayout(t, testImage(t, v1.Config{}, base, layerOf(t, entry{name: "a.txt", body: "a"}))))
	if err != nil {
		t.Fatal(err)
	}
	b, err := s.Import(context.Background(), writeLayout(t, testImage(t, v1.Config{}, base, layerOf(t, entry{name: "b.txt", body: "b"}))))
	if err != nil {
		t.Fatal(err)
	}
	_, freed, err := s.Remove(a.ID)
	if err != nil {
		t.Fatal(err)
	}
	if freed.Blobs != 3 || freed.Roots != 1 {
		t.Errorf("freed %+v: want a's own layer, manifest, config and root", freed)
	}
	if _, err := os.Stat(s.RootPath(a.Chain)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a's root still there: %v", err)
	}
	if _, err := os.Stat(filepath.Join(s.RootPath(b.Chain), "base.txt")); err != nil {
		t.Errorf("b's root lost its shared layer: %v", err)
	}
	if _, err := s.Get(a.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("Get after Remove: %v", err)
	}
	if _, err := s.Import(context.Background(), writeLayout(t, testImage(t, v1.Config{}, base, layerOf(t, entry{name: "a.txt", body: "a"})))); err != nil {
		t.Errorf("import again after removal: %v", err)
	}
}

// TestExportedImagesImportAgainAsThemselves: Export writes every image as
// one OCI layout (a backup), from which ImportAll brings each back into an
// empty store with the same ID, config and files; the layout also reads as
// an ordinary OCI layout.
func TestExportedImagesImportAgainAsThemselves(t *testing.T) {
	s := openStore(t)
	a, err := s.Import(context.Background(), writeLayout(t, twoLayers(t)))
	if err != nil {
		t.Fatal(err)
	}
	docker := filepath.Join(t.TempDir(), "docker.tar")
	if err := tarball.WriteToFile(docker, nil, testImage(t, v1.Config{Cmd: []string{"/b"}}, layerOf(t, entry{name: "b.txt", body: "b"}))); err != nil {
		t.Fatal(err)
	}
	b, err := s.Import(context.Background(), docker)
	if err != nil {
		t.Fatal(err)
	}
	backup := filepath.Join(t.TempDir(), "images")
	if n, err := s.Export(backup); err != nil || n != 2 {
		t.Fatalf("Export: %d, %v", n, err)
	}
	restored := openStore(t)
	got, err := restored.ImportAll(context.Background(), backup)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].ID != a.ID || got[1].ID != b.ID || !slices.Equal(got[1].Config.Cmd, []string{"/b"}) || got[1].Source != docker {
		t.Fatalf("restored %+v, want %s and %s with their configs and sources", got, a.ID, b.ID)
	}
	if body, err := os.ReadFile(filepath.Join(restored.RootPath(got[0].Chain), "data/new.bin")); err != nil || string(body) != "new" {
		t.Errorf("restored root: %q, %v", body, err)
	}
	if _, err := openLayout(backup); err != nil {
		t.Errorf("the export is not an OCI layout go-containerregistry reads: %v", err)
	}
}

// TestStoreKeepsItsFilesTheDataDirOwners: an import by root into a data dir
// that belongs to another user (the packaged service's) leaves what the
// store keeps to that user, so that the daemon can read it; inside the
// root, the image's own owners stay.
func TestStoreKeepsItsFilesTheDataDirOwners(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("root: an import that gives files away")
	}
	data := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(data, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(data, 61234, 61235); err != nil {
		t.Fatal(err)
	}
	s, err := Open(filepath.Join(data, "images"))
	if err != nil {
		t.Fatal(err)
	}
	im, err := s.Import(context.Background(), writeLayout(t, twoLayers(t)))
	if err != nil {
		t.Fatal(err)
	}
	owner := func(p string) (int, int) {
		fi, err := os.Lstat(p)
		if err != nil {
			t.Fatal(err)
		}
		st := fi.Sys().(*syscall.Stat_t)
		return int(st.Uid), int(st.Gid)
	}
	kept := []string{s.Dir(), s.path("blobs", "sha256"), s.path("images", strings.TrimPrefix(im.ID, "sha256:")+".json"),
		s.blobPath(im.Layers[0].Digest), s.blobPath(im.ID), s.RootPath(im.Chain), s.path("lock")}
	for _, p := range kept {
		if u, g := owner(p); u != 61234 || g != 61235 {
			t.Errorf("%s belongs to %d:%d, want the data dir's 61234:61235", p, u, g)
		}
	}
	if u, _ := owner(filepath.Join(s.RootPath(im.Chain), "etc/version")); u != 0 {
		t.Errorf("a file of the image belongs to %d, want the image's own (0)", u)
	}
}

// TestImportingAKnownArchiveAgainReadsNoLayer: an archive whose image the
// store holds (apply run again) is answered from the store after reading
// its index, manifest and config: its layers are neither copied nor
// checked again (here one was damaged since, and it goes unread).
func TestImportingAKnownArchiveAgainReadsNoLayer(t *testing.T) {
	s := openStore(t)
	img := twoLayers(t)
	first, err := s.Import(context.Background(), testimage.OCIArchive(t, img, filepath.Join(t.TempDir(), "a.tar")))
	if err != nil {
		t.Fatal(err)
	}
	dir := writeLayout(t, img)
	corruptBlob(t, dir, layerDigest(t, img, 0))
	again := filepath.Join(t.TempDir(), "again.tar")
	f, err := os.Create(again)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	tw.Close()
	f.Close()
	got, err := s.Import(context.Background(), again)
	if err != nil || got.ID != first.ID {
		t.Errorf("import of the known image again: %v, %v; want %s from the store", got.ID, err, first.ID)
	}
}
