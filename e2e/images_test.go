package e2e

// Models that bring their own world (issue 46): a project whose model is
// an OCI image archive, imported by apply or `inferd image import`, run by
// the real daemon under every protection of the sandbox.

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"inferd/internal/testenv"
	"inferd/internal/testimage"
)

// modelArchive writes an image whose only program is examples/imagemodel
// (static) to path, as an oci-archive tar or, with docker, as docker save
// writes one.
func modelArchive(t *testing.T, path string, docker bool) string {
	t.Helper()
	img := testimage.Image(t, v1.Config{Entrypoint: []string{"/bin/model"}, Env: []string{"PATH=/bin", "GREETING=from the image"}, WorkingDir: "/srv"},
		[]testimage.File{{Path: "bin/model", Host: testimage.Model(t, ".")}, {Path: "etc/image-release", Body: "imagemodel 1\n"}})
	if docker {
		return testimage.DockerArchive(t, img, path)
	}
	return testimage.OCIArchive(t, img, path)
}

// TestImageProjectAnswersFromItsOwnWorld: a project with image: and no
// command answers calls from the image's Entrypoint, as a uid of its own,
// seeing the image's files (read-only), its project dir, a writable /tmp
// and nothing of the host; the image is listed with its project and cannot
// be removed while the project uses it; a hostile archive is refused with
// the reason and leaves the store as it was.
func TestImageProjectAnswersFromItsOwnWorld(t *testing.T) {
	testenv.NeedRoot(t, "an image's root is mounted in the replica's mount namespace, which needs root")
	t.Parallel()
	dir, cfg := newDaemonDir(t, "")
	modelArchive(t, filepath.Join(dir, "model.tar"), false)
	weights := filepath.Join(dir, "weights")
	if err := os.MkdirAll(weights, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(weights, "w.txt"), []byte("the weights"), 0o644); err != nil {
		t.Fatal(err)
	}
	openToAll(t, filepath.Dir(dir), dir, weights)
	d := startDaemonEnv(t, dir, cfg) // models under a uid of their own
	key := d.createKey("acme", false)
	out := d.apply(`projects:
  - id: img
    team: acme
    modelKey: mk-img
    image: model.tar
    dir: weights
    env: {GREETING: "from the project"}
    bootTimeout: 60
`)
	if !strings.Contains(out, "project img: image ") {
		t.Errorf("apply said:\n%s\nwant the image it imported", out)
	}
	c := inferenceClient{t: t, base: d.base, key: key}
	inferdPath, _ := filepath.Abs(inferdBin)
	r := c.start("mk-img", fmt.Sprintf(`{"stat": ["/etc/image-release", "/etc/passwd", "/usr", "/root", %q, %q], "read": %q, "write": "/etc/written", "env": ["GREETING", "PATH"]}`,
		inferdPath, weights, filepath.Join(weights, "w.txt")), false)
	if r["message"] != "success" {
		t.Fatalf("call: %v\nlogs:\n%s", r, d.logs)
	}
	var got struct {
		Root  []string          `json:"root"`
		UID   int               `json:"uid"`
		Cwd   string            `json:"cwd"`
		Stat  map[string]string `json:"stat"`
		Read  string            `json:"read"`
		Write string            `json:"write"`
		Env   map[string]string `json:"env"`
	}
	b, _ := json.Marshal(r["modelOutputs"].([]any)[0])
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"/etc/image-release": "file", "/etc/passwd": "absent", "/usr": "absent", "/root": "absent", inferdPath: "absent", weights: "dir"}
	for p, w := range want {
		if got.Stat[p] != w {
			t.Errorf("the model sees %s as %q, want %q (it sees %v)", p, got.Stat[p], w, got.Stat)
		}
	}
	if got.Read != "the weights" || !strings.Contains(got.Write, "read-only file system") || got.Cwd != weights {
		t.Errorf("read %q, write %q, cwd %q: want its dir's file, a read-only root, and its dir as the working dir", got.Read, got.Write, got.Cwd)
	}
	if got.UID == 0 || got.Env["GREETING"] != "from the project" || got.Env["PATH"] != "/bin" {
		t.Errorf("uid %d, env %v: want a uid of its own, the project's GREETING and the image's PATH", got.UID, got.Env)
	}
	for _, name := range got.Root {
		if name == "usr" || name == "root" || name == "home" || name == "boot" {
			t.Errorf("the model's / has the host's %s: %v", name, got.Root)
		}
	}

	doc, _ := d.cli("doctor")
	if !strings.Contains(doc, "ok    images       1 images in ") || !regexpMatch(`ok    image +img: image [0-9a-f]{12} \(1 layers`, doc) {
		t.Errorf("doctor says:\n%s\nwant the image's disk use and the project's image", doc)
	}
	admin := d.createKey("acme", true)
	if _, st := do(t, "GET", d.base+"/v1/status", map[string]string{"X-Service-API-Key": admin}, ""); st["images"] == nil ||
		st["images"].(map[string]any)["count"] != 1.0 || st["images"].(map[string]any)["rootBytes"].(float64) < 1<<20 {
		t.Errorf("/v1/status images: %v, want one image of at least the model's MiB", st["images"])
	}

	list, err := d.cli("image", "list")
	if err != nil || !strings.Contains(list, "acme/img") {
		t.Errorf("image list: %v\n%s\nwant the image with its project", err, list)
	}
	id := strings.Fields(strings.Split(list, "\n")[1])[0]
	if _, err := d.cli("image", "rm", id); err == nil || !strings.Contains(err.Error(), "used by project acme/img") {
		t.Errorf("image rm of a used image: %v; want a refusal naming the project", err)
	}

	evil := testimage.OCIArchive(t, testimage.Image(t, v1.Config{}, []testimage.File{{Path: "../../etc/cron.d/evil", Body: "x"}}), filepath.Join(dir, "evil.tar"))
	_, err = d.cli("image", "import", evil)
	if err == nil || !strings.Contains(err.Error(), `image refused`) || !strings.Contains(err.Error(), `"../../etc/cron.d/evil" writes outside the image's root`) {
		t.Errorf("import of a hostile archive: %v; want the refusal and its reason", err)
	}
	if list2, _ := d.cli("image", "list"); strings.Count(list2, "\n") != 2 {
		t.Errorf("after the refused import the list is:\n%s\nwant the one image", list2)
	}
}

// TestImageImportedByIDRunsItsCmd: a docker save archive imported with
// inferd image import, named by its ID in a project with a command of its
// own, runs that command; a project naming an image this node does not
// hold fails its calls saying so.
func TestImageImportedByIDRunsItsCmd(t *testing.T) {
	testenv.NeedRoot(t, "an image's root is mounted in the replica's mount namespace, which needs root")
	t.Parallel()
	dir, cfg := newDaemonDir(t, "")
	archive := modelArchive(t, filepath.Join(dir, "docker.tar"), true)
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	out, err := d.cli("image", "import", archive)
	if err != nil {
		t.Fatal(err)
	}
	id := strings.Fields(strings.SplitN(out, ": ", 2)[1])[0]
	d.apply(fmt.Sprintf(`projects:
  - id: byid
    team: acme
    modelKey: mk-byid
    image: %s
    command: ["model"]
    bootTimeout: 60
  - id: missing
    team: acme
    modelKey: mk-missing
    image: sha256:0123456789abcdef0123
    bootTimeout: 60
`, id))
	c := inferenceClient{t: t, base: d.base, key: key}
	r := c.start("mk-byid", `{"env": ["GREETING"]}`, false)
	if r["message"] != "success" {
		t.Fatalf("call: %v", r)
	}
	outputs := r["modelOutputs"].([]any)[0].(map[string]any)
	if outputs["cwd"] != "/srv" || outputs["env"].(map[string]any)["GREETING"] != "from the image" {
		t.Errorf("the model answered %v: want the image's WorkingDir and Env", outputs)
	}
	r = c.start("mk-missing", `{}`, false)
	if msg, _ := r["message"].(string); !strings.Contains(msg, "image 0123456789ab is not imported on this node") {
		t.Errorf("call to a project whose image is absent: %v", r)
	}

	// A backup carries the image; a restore on a fresh data dir brings it
	// back, and the project runs from it there.
	backup := filepath.Join(t.TempDir(), "inferd.backup")
	if out, err := d.cli("backup", backup); err != nil || !strings.Contains(out, "1 images written to "+backup+".images") {
		t.Fatalf("backup: %v\n%s", err, out)
	}
	d.stop()
	dir2, cfg2 := newDaemonDir(t, "")
	if out, err := runCLI(cfg2, "restore", backup); err != nil || !strings.Contains(out, "imported 1 images from "+backup+".images") {
		t.Fatalf("restore: %v\n%s", err, out)
	}
	d2 := startDaemon(t, dir2, cfg2)
	c2 := inferenceClient{t: t, base: d2.base, key: key}
	if r := c2.start("mk-byid", `{}`, false); r["message"] != "success" {
		t.Errorf("call after the restore: %v", r)
	}
}

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }
