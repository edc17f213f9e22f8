package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"inferd/config"
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
	for _, p := range projects {
		doctorProject(r, mc, p)
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
