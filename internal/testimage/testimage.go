// Package testimage builds OCI images for tests from files on this
// machine, with go-containerregistry: an OCI layout directory, a tar of
// one (skopeo's oci-archive:) or a docker save archive, so that tests of
// image projects need no registry, no network and no docker.
package testimage

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sort"
	"sync"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// File is one file of a layer: Body, or the host file at Host, at Path.
type File struct {
	Path string // in the image, without a leading /
	Host string
	Body string
	Mode int64 // 0 = 0755 for a host file, 0644 for a body
}

// Image is an image with one layer per files list and cfg as its config.
func Image(t testing.TB, cfg v1.Config, layers ...[]File) v1.Image {
	t.Helper()
	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	for _, files := range layers {
		b := layerTar(t, files)
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil },
			tarball.WithMediaType(types.OCILayer))
		if err != nil {
			t.Fatal(err)
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			t.Fatal(err)
		}
	}
	img, err := mutate.Config(img, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return img
}

func layerTar(t testing.TB, files []File) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		body := []byte(f.Body)
		mode := f.Mode
		if f.Host != "" {
			var err error
			if body, err = os.ReadFile(f.Host); err != nil {
				t.Fatal(err)
			}
			if mode == 0 {
				mode = 0o755
			}
		}
		if mode == 0 {
			mode = 0o644
		}
		for d := filepath.Dir(f.Path); d != "." && d != "/" && !dirs[d]; d = filepath.Dir(d) {
			dirs[d] = true
		}
		if err := tw.WriteHeader(&tar.Header{Name: f.Path, Mode: mode, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		tw.Write(body)
	}
	// Parent directories after their files is legal in a layer; keep them
	// sorted so that the same files make the same layer.
	var names []string
	for d := range dirs {
		names = append(names, d)
	}
	sort.Strings(names)
	for _, d := range names {
		tw.WriteHeader(&tar.Header{Name: d + "/", Mode: 0o755, Typeflag: tar.TypeDir})
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layout writes img as an OCI image layout under dir and returns its path.
func Layout(t testing.TB, img v1.Image, dir string) string {
	t.Helper()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithPlatform(v1.Platform{OS: "linux", Architecture: runtime.GOARCH})); err != nil {
		t.Fatal(err)
	}
	return dir
}

// OCIArchive writes img as a tar of an OCI layout (skopeo's
// oci-archive:) at path.
func OCIArchive(t testing.TB, img v1.Image, path string) string {
	t.Helper()
	dir := Layout(t, img, filepath.Join(t.TempDir(), "layout"))
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	if err := tw.AddFS(os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	return path
}

// DockerArchive writes img as docker save does, at path.
func DockerArchive(t testing.TB, img v1.Image, path string) string {
	t.Helper()
	if err := tarball.WriteToFile(path, nil, img); err != nil {
		t.Fatal(err)
	}
	return path
}

var (
	buildOnce sync.Once
	built     string
	buildErr  error
)

// Model builds examples/imagemodel static (CGO_ENABLED=0) once per test
// binary and returns its path: a model server that can be an image's only
// file. moduleRoot is the repository's root.
func Model(t testing.TB, moduleRoot string) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "imagemodel-")
		if err != nil {
			buildErr = err
			return
		}
		os.Chmod(dir, 0o755) // a model run from the host, under a uid of its own, reads it here
		built = filepath.Join(dir, "imagemodel")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", built, "./examples/imagemodel")
		cmd.Dir = moduleRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("build examples/imagemodel: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}
