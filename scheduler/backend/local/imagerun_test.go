package local

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"inferd/gpu"
	"inferd/image"
	"inferd/internal/testimage"
	"inferd/scheduler/backend"
	"inferd/store"
)

// modelImage imports an image whose only program is examples/imagemodel
// (a static binary) into b's store, with a file of its own in /etc.
func modelImage(t *testing.T, b *Backend, cfg v1.Config) image.Image {
	t.Helper()
	model := testimage.Model(t, "../../..")
	img := testimage.Image(t, cfg, []testimage.File{
		{Path: "bin/model", Host: model},
		{Path: "etc/image-release", Body: "imagemodel 1\n"},
	})
	im, err := b.images.Import(context.Background(), testimage.Layout(t, img, filepath.Join(t.TempDir(), "layout")))
	if err != nil {
		t.Fatal(err)
	}
	return im
}

func imageBackend(t *testing.T) *Backend {
	t.Helper()
	b := testBackendWith(t, func(c *Config) { c.ImageDir = filepath.Join(t.TempDir(), "images") })
	needNamespaces(t, b)
	return b
}

// askModel posts inputs to examples/imagemodel in p and decodes its answer.
func askModel(t *testing.T, p *Process, inputs any) map[string]any {
	t.Helper()
	body, _ := json.Marshal(inputs)
	resp, err := modelClient(p).Post(modelURL(p, "/"), "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestImageModelSeesOnlyItsImageAndItsDir: a model in an image finds the
// image's files (read-only), its project's dir at its own path, a
// writable /tmp, the image's Env under the project's, and nothing of the
// host's.
func TestImageModelSeesOnlyItsImageAndItsDir(t *testing.T) {
	b := imageBackend(t)
	im := modelImage(t, b, v1.Config{Entrypoint: []string{"/bin/model"}, Env: []string{"PATH=/bin", "GREETING=from the image", "IMAGE_ONLY=1"}, WorkingDir: "/srv"})
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "weights.txt"), []byte("w1"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		dir     string
		wantCwd string
	}{
		{"with a dir", dir, dir},
		{"in the image's WorkingDir", "", "/srv"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := backend.Spec{ReplicaID: "img-" + strings.ReplaceAll(tc.name, " ", "-"), ProjectID: "img", TeamID: "team",
				Model: store.ModelSpec{Image: im.ID, Dir: tc.dir, Env: map[string]string{"GREETING": "from the project"}}}
			p := startReady(t, b, spec)
			host, _ := os.Executable() // a host file no image has
			out := askModel(t, p, map[string]any{
				"stat":  []string{"/etc/image-release", "/etc/passwd", "/usr", "/root", host, filepath.Join(dir, "weights.txt")},
				"read":  "/etc/image-release",
				"write": "/etc/written",
				"env":   []string{"GREETING", "IMAGE_ONLY", "PATH", "HOME"},
			})
			var root []string
			for _, e := range out["root"].([]any) {
				root = append(root, e.(string))
			}
			if want := []string{"bin", "dev", "etc", "proc", "srv", "sys", "tmp", "var"}; !slices.Equal(root, want) && !(tc.dir != "" && slices.Equal(root, slices.DeleteFunc(want, func(s string) bool { return s == "srv" }))) {
				t.Errorf("the model's / holds %v, want %v", root, want)
			}
			stat := out["stat"].(map[string]any)
			wantStat := map[string]string{"/etc/image-release": "file", "/etc/passwd": "absent", "/usr": "absent", "/root": "absent", host: "absent",
				filepath.Join(dir, "weights.txt"): map[bool]string{true: "file", false: "absent"}[tc.dir != ""]}
			for p, want := range wantStat {
				if stat[p] != want {
					t.Errorf("stat %s: %v, want %s", p, stat[p], want)
				}
			}
			if out["read"] != "imagemodel 1\n" || !strings.Contains(out["write"].(string), "read-only file system") {
				t.Errorf("read %q, write %q: want the image's file, and a read-only root", out["read"], out["write"])
			}
			env := out["env"].(map[string]any)
			if env["GREETING"] != "from the project" || env["IMAGE_ONLY"] != "1" || env["PATH"] != "/bin" || env["HOME"] != p.box.dir {
				t.Errorf("env %v: want the project's GREETING over the image's, the image's IMAGE_ONLY and PATH, HOME %s", env, p.box.dir)
			}
			if out["cwd"] != tc.wantCwd {
				t.Errorf("cwd %v, want %s", out["cwd"], tc.wantCwd)
			}
			if w := askModel(t, p, map[string]any{"write": "/tmp/scratch"}); w["write"] != "ok" {
				t.Errorf("write /tmp/scratch: %v", w["write"])
			}
		})
	}
}

// TestImageStartFailuresSayWhy: an image project that cannot start says
// why: a hostile archive, an image with nothing to run, a program the
// image lacks, a host without mount namespaces.
func TestImageStartFailuresSayWhy(t *testing.T) {
	b := imageBackend(t)
	bare := modelImage(t, b, v1.Config{})
	hostile := testimage.OCIArchive(t, testimage.Image(t, v1.Config{}, []testimage.File{{Path: "../../etc/cron.d/evil", Body: "x"}}), filepath.Join(t.TempDir(), "evil.tar"))
	for _, tc := range []struct {
		name string
		set  func(*store.ModelSpec)
		off  bool // no namespaces
		want string
	}{
		{"hostile archive", func(m *store.ModelSpec) { m.Image = hostile }, false, `image refused: layer sha256:`},
		{"nothing to run", func(m *store.ModelSpec) { m.Image = bare.ID }, false, "has no Entrypoint or Cmd, and the project no command"},
		{"no such program", func(m *store.ModelSpec) { m.Image, m.Command = bare.ID, []string{"python3", "server.py"} }, false, "python3: not found in the image's PATH"},
		{"not imported", func(m *store.ModelSpec) { m.Image = "sha256:0123456789abcdef" }, false, "is not imported on this node"},
		{"no namespaces", func(m *store.ModelSpec) { m.Image, m.Command = bare.ID, []string{"/bin/model"} }, true, "needs the sandbox's mount namespace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := b
			if tc.off {
				b = testBackendWith(t, func(c *Config) { c.ImageDir = b.cfg.ImageDir })
				noNamespaces(b)
			}
			spec := backend.Spec{ReplicaID: "fail-" + strings.ReplaceAll(tc.name, " ", "-"), ProjectID: "img", TeamID: "team"}
			tc.set(&spec.Model)
			p, err := b.start(spec)
			if err == nil {
				t.Cleanup(func() { p.stop(0) })
				waitExited(t, p)
				err = p.ExitErr()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("got %v, want an error that says %q", err, tc.want)
			}
		})
	}
	u, err := b.images.Usage()
	if err != nil || u.Images != 1 {
		t.Errorf("the store after the hostile archive: %+v, %v; want only the good image", u, err)
	}
}

// TestGPUImageReplicaGetsItsNodesAndTheDriver: a replica in an image given
// GPU 0 finds nvidiactl and GPU 0's node in its /dev (not GPU 1's), and the
// host driver's libraries and tools under /usr/local/nvidia, which its
// LD_LIBRARY_PATH and PATH name; a CPU replica of the same image gets none.
func TestGPUImageReplicaGetsItsNodesAndTheDriver(t *testing.T) {
	dev := fakeDevDir(t)
	gpus := gpu.Simulated([]gpu.SimulatedGPU{{}, {}})
	b := testBackendWith(t, func(c *Config) {
		c.ImageDir, c.DevDir, c.GPUs, c.DriverRoot = filepath.Join(t.TempDir(), "images"), dev, gpus, fakeDriverRoot(t)
	})
	needNamespaces(t, b)
	im := modelImage(t, b, v1.Config{Entrypoint: []string{"/bin/model"}, Env: []string{"PATH=/bin"}})
	paths := []string{"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia-uvm", "/dev/null",
		"/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1", "/usr/local/nvidia/lib64/libcudart.so.12", "/usr/local/nvidia/bin/nvidia-smi"}
	for _, tc := range []struct {
		name    string
		gpus    []string
		present []string
		env     map[string]any
	}{
		{"given GPU 0", []string{gpus.Devices()[0].UUID}, []string{"/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm", "/dev/null",
			"/usr/local/nvidia/lib64/libcuda.so.1", "/usr/local/nvidia/lib64/libnvidia-ml.so.1", "/usr/local/nvidia/bin/nvidia-smi"},
			map[string]any{"PATH": "/bin:/usr/local/nvidia/bin", "LD_LIBRARY_PATH": "/usr/local/nvidia/lib64"}},
		{"a CPU replica", nil, []string{"/dev/null"}, map[string]any{"PATH": "/bin", "LD_LIBRARY_PATH": ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := backend.Spec{ReplicaID: "gpu-img-" + strings.ReplaceAll(tc.name, " ", "-"), ProjectID: "img", TeamID: "team", GPUs: tc.gpus,
				Model: store.ModelSpec{Image: im.ID}}
			p := startReady(t, b, spec)
			out := askModel(t, p, map[string]any{"stat": paths, "read": "/usr/local/nvidia/lib64/libcuda.so.1", "env": []string{"PATH", "LD_LIBRARY_PATH"}})
			stat := out["stat"].(map[string]any)
			for _, path := range paths {
				want := "absent"
				if slices.Contains(tc.present, path) {
					want = "file"
				}
				if stat[path] != want {
					t.Errorf("%s: %v, want %s", path, stat[path], want)
				}
			}
			if len(tc.gpus) > 0 && out["read"] != "fake libcuda" {
				t.Errorf("libcuda.so.1 reads %q, want the host driver's", out["read"])
			}
			for k, v := range tc.env {
				if got := out["env"].(map[string]any)[k]; got != v {
					t.Errorf("%s=%q, want %q", k, got, v)
				}
			}
		})
	}
}
