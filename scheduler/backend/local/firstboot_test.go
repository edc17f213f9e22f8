package local

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/rs/zerolog"

	"inferd/internal/testimage"
	"inferd/internal/testwheel"
	"inferd/scheduler/backend"
	"inferd/store"
)

// firstBootServer is a stdlib model server whose one import is greet: the
// python runs of BenchmarkFirstBoot serve it from a venv, the plain run
// without greet.
const firstBootServer = `import http.server, os
try:
    import greet
except ImportError:
    pass
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")
http.server.ThreadingHTTPServer((os.environ["HOST"], int(os.environ["PORT"])), H).serve_forever()
`

// BenchmarkFirstBoot: from a launch to the model's first healthy answer, as
// root in the full sandbox (uid per project, cgroup, private network, PID
// and mount namespaces), for a model shipped each way:
//
//   - static: examples/imagemodel (a static binary) run from the host, and
//     from an image of that one file, imported beforehand (image) or as
//     part of the first boot (image+import: the archive read, checked and
//     unpacked into a fresh store);
//   - python: a stdlib HTTP server run by /usr/bin/python3 (plain), and
//     from a venv of a one-wheel wheelhouse, built beforehand (venv) or as
//     part of the first boot (venv+build: a fresh venv, offline).
//
// -count repeats each sub-benchmark before the next: run the test binary
// in a loop instead, so that the cases interleave, and compare them as
// ratios within each run (docs/benchmarks.md has the loop).
func BenchmarkFirstBoot(b *testing.B) {
	needRootB(b)
	work := b.TempDir()
	model := testimage.Model(b, "../../..")
	layout := testimage.Layout(b, testimage.Image(b, v1.Config{Entrypoint: []string{"/bin/model"}}, []testimage.File{{Path: "bin/model", Host: model}}), filepath.Join(work, "layout"))
	house := testwheel.Wheelhouse(b, work, "greet", "hi")
	reqs := filepath.Join(work, "requirements.txt")
	server := filepath.Join(work, "server.py")
	for p, body := range map[string]string{reqs: "greet==1.0\n", server: firstBootServer} {
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			b.Fatal(err)
		}
	}
	for _, d := range []string{work, filepath.Dir(work)} {
		os.Chmod(d, 0o755) // the models' uids read the server and the host binary
	}
	// Every boot is timed on a backend of its own (a fresh data dir but
	// for a store or environment made beforehand), after one untimed
	// boot there, so that no case pays for the backend's first launch.
	newBackend := func(b *testing.B, images, python string) *Backend {
		dir := b.TempDir()
		if images == "" {
			images = filepath.Join(dir, "data", "images")
		}
		if python == "" {
			python = filepath.Join(dir, "data", "python")
		}
		be, err := New(Config{LogDir: filepath.Join(dir, "logs"), RunDir: filepath.Join(dir, "run"), UIDFile: filepath.Join(dir, "uids.json"),
			ImageDir: images, PythonDir: python}, zerolog.Nop())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(be.Close)
		if be.sb.nsErr != nil {
			b.Skipf("no namespaces here: %v", be.sb.nsErr)
		}
		bootToReady(b, be, "warm", store.ModelSpec{Command: []string{model}})
		return be
	}
	py := store.PythonSpec{Requirements: reqs, Wheelhouse: house, Interpreter: testwheel.Python}
	for _, tc := range []struct {
		name string
		// prepare makes what the case finds made (untimed), once per
		// sub-benchmark, in shared; model is what is booted (timed).
		prepare func(b *testing.B, be *Backend)
		model   func(be *Backend) store.ModelSpec
		shared  string // "images" or "python": the store or environments kept across boots
	}{
		{name: "static/plain", model: func(*Backend) store.ModelSpec { return store.ModelSpec{Command: []string{model}} }},
		{name: "static/image", shared: "images", prepare: func(b *testing.B, be *Backend) {
			if _, err := be.images.Import(context.Background(), layout); err != nil {
				b.Fatal(err)
			}
		}, model: func(be *Backend) store.ModelSpec {
			im, _ := be.images.List()
			return store.ModelSpec{Image: im[0].ID}
		}},
		{name: "static/image+import", model: func(*Backend) store.ModelSpec { return store.ModelSpec{Image: layout} }},
		{name: "python/plain", model: func(*Backend) store.ModelSpec { return store.ModelSpec{Command: []string{testwheel.Python, server}} }},
		{name: "python/venv", shared: "python", prepare: func(b *testing.B, be *Backend) {
			if _, err := be.pythonEnv(backend.Spec{Model: store.ModelSpec{Python: py}}, nopWriter{}); err != nil {
				b.Fatal(err)
			}
		}, model: func(*Backend) store.ModelSpec {
			return store.ModelSpec{Command: []string{"python3", server}, Python: py}
		}},
		{name: "python/venv+build", model: func(*Backend) store.ModelSpec {
			return store.ModelSpec{Command: []string{"python3", server}, Python: py}
		}},
	} {
		b.Run(tc.name, func(b *testing.B) {
			var images, python string
			switch tc.shared {
			case "images":
				images = filepath.Join(b.TempDir(), "images")
			case "python":
				python = filepath.Join(b.TempDir(), "python")
			}
			b.StopTimer()
			for i := range b.N {
				be := newBackend(b, images, python)
				if i == 0 && tc.prepare != nil {
					tc.prepare(b, be)
				}
				m := tc.model(be)
				b.StartTimer()
				p := bootToReady(b, be, strconv.Itoa(i), m)
				b.StopTimer()
				p.stop(0)
			}
		})
	}
}

// bootToReady starts a replica of m on be and waits until it is ready.
func bootToReady(b *testing.B, be *Backend, id string, m store.ModelSpec) *Process {
	m.Protocol, m.HealthPath = store.ProtocolHTTP, "/healthz"
	p, err := be.start(backend.Spec{ReplicaID: "boot-" + id, ProjectID: "boot", TeamID: "bench", Model: m})
	if err != nil {
		b.Fatal(err)
	}
	select {
	case <-p.Ready():
	case <-p.Exited():
		b.Fatalf("exited before ready: %v, %q", p.ExitErr(), p.LastLogLine())
	case <-time.After(5 * time.Minute):
		b.Fatal("not ready after 5 minutes")
	}
	if id == "warm" {
		p.stop(0)
	}
	return p
}

type nopWriter struct{}

func (nopWriter) Write(p []byte) (int, error) { return len(p), nil }

func needRootB(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("root: the full sandbox")
	}
}
