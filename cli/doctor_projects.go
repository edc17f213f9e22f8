package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"inferd/config"
	"inferd/image"
	"inferd/store"
	"inferd/store/bolt"
)

// doctorProjects checks every applied project's model as serve will run it
// (dir, program, model user, GPUs: see local.Checker), one line per finding
// with its fix, or one ok line per project; then whether the projects'
// minimums fit the machine and leave every project a CPU slot or GPU
// (scheduler.MinimumsWarnings). The projects come from the
// running daemon, or from the data file opened read-only; doctor never
// creates it.
func doctorProjects(ctx context.Context, r *doctorReport, cfg config.Config, running bool) {
	projects, err := appliedProjects(ctx, cfg, running)
	switch {
	case err != nil:
		r.line("warn", "projects", "cannot read the applied projects: %v", err)
		return
	case len(projects) == 0:
		r.line("ok", "projects", "none applied yet (inferd apply -f MANIFEST.yaml)")
		return
	}
	mc := newMachineCheck(cfg)
	defer mc.close()
	images := image.Peek(cfg.ImageDir())
	for _, p := range projects {
		doctorProject(r, mc, p)
		doctorProjectImage(r, images, p)
		if needsCUDA(p.Model) {
			status, text := mc.CUDA(ctx, p)
			r.line(status, "cuda", "%s: %s", p.ID, text)
		}
	}
	for _, w := range mc.CapacityWarnings(projects) {
		r.line("warn", "capacity", "%s", w)
	}
}

// doctorProject reports what mc finds wrong with p, or one ok line.
func doctorProject(r *doctorReport, mc *machineCheck, p store.Project) {
	findings := mc.Check(p.Model)
	if len(findings) == 0 {
		gpus := "CPU"
		if n := p.Model.GPUDemand().GPUs; n > 0 {
			gpus = fmt.Sprintf("%d GPU(s) fit", n)
		}
		r.line("ok", "project", "%s: dir, command and model user ok; %s", p.ID, gpus)
		return
	}
	for _, f := range findings {
		status := "warn"
		if f.Fatal {
			status = "fail"
		}
		r.line(status, "project", "%s: %s", p.ID, f.Text)
	}
}

// doctorProjectImage fails a project whose image this node does not hold:
// its replicas could not start here.
func doctorProjectImage(r *doctorReport, images *image.Store, p store.Project) {
	ref := p.Model.Image
	if ref == "" {
		return
	}
	if !strings.HasPrefix(ref, "sha256:") {
		if _, err := os.Stat(ref); err != nil {
			r.line("fail", "image", "%s: its image file %s cannot be read (%v): fix image in the manifest", p.ID, ref, err)
		}
		return // imported by its first replica
	}
	im, err := images.Get(ref)
	switch {
	case errors.Is(err, image.ErrNotFound):
		r.line("fail", "image", "%s: image %s is not imported on this node: inferd image import FILE here (docs/images.md)", p.ID, image.Short(ref))
	case err != nil:
		r.line("warn", "image", "%s: %v", p.ID, err)
	default:
		r.line("ok", "image", "%s: image %s (%d layers, %s unpacked)", p.ID, im.Short(), len(im.Layers), humanBytes(uint64(im.RootBytes)))
	}
}

// doctorImages says what this node's images take on disk.
func doctorImages(r *doctorReport, cfg config.Config) {
	u, err := image.Peek(cfg.ImageDir()).Usage()
	switch {
	case err != nil:
		r.line("warn", "images", "cannot read %s: %v", cfg.ImageDir(), err)
	case u.Images == 0:
		r.line("ok", "images", "none imported (docs/images.md)")
	default:
		r.line("ok", "images", "%d images in %s: %s of layers, %s unpacked (inferd image list; inferd image gc frees what no image uses)",
			u.Images, cfg.ImageDir(), humanBytes(uint64(u.BlobBytes)), humanBytes(uint64(u.RootBytes)))
	}
}

// appliedProjects lists the projects, from the daemon when it runs, else
// from the data file if there is one.
func appliedProjects(ctx context.Context, cfg config.Config, running bool) ([]store.Project, error) {
	if running {
		a, err := dialAdmin(cfg)
		if err != nil {
			return nil, err
		}
		defer a.close()
		var out struct {
			Results []store.Project `json:"results"`
		}
		if err := a.call(ctx, "GET", "/admin/projects", nil, &out); err != nil {
			return nil, err
		}
		return out.Results, nil
	}
	st, err := bolt.Open(cfg.StorePath(), bolt.Options{Timeout: time.Second, ReadOnly: true})
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer st.Close()
	return st.ListProjects("")
}
