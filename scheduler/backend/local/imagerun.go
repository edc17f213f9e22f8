package local

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"inferd/image"
	"inferd/scheduler/backend"
	"inferd/scheduler/backend/local/replicainit"
	"inferd/store"
)

// A project with an image runs its model inside it (docs/images.md): the
// image's unpacked root becomes the replica's / in its mount namespace
// (replicainit/imageroot.go), with the image's Entrypoint and Cmd as the
// command's default, its WorkingDir as the dir's and its Env first in the
// environment. Everything else of the box (uid, cgroup, network, PID
// namespace, seccomp filter, device rules) is as for any replica.

// defaultImagePath is the PATH of an image whose Env sets none: docker's.
const defaultImagePath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// resolveImage finds the image m names in the backend's store: by ID, or
// by the path of an archive, which it imports (once: the store knows an
// image it holds).
func (b *Backend) resolveImage(m store.ModelSpec) (*image.Image, error) {
	if m.Image == "" {
		return nil, nil
	}
	if b.images == nil {
		return nil, errors.New("this daemon keeps no images (no data dir)")
	}
	var (
		im  image.Image
		err error
	)
	if strings.HasPrefix(m.Image, "sha256:") {
		im, err = b.images.Get(m.Image)
		if errors.Is(err, image.ErrNotFound) {
			err = fmt.Errorf("image %s is not imported on this node: run inferd image import FILE here", image.Short(m.Image))
		}
	} else {
		im, err = b.images.Import(context.Background(), m.Image)
	}
	if err != nil {
		return nil, err
	}
	return &im, nil
}

// ImageUsage says what this node's images take on disk: none when the
// backend keeps none.
func (b *Backend) ImageUsage() (image.Usage, error) {
	if b.images == nil {
		return image.Usage{}, nil
	}
	return b.images.Usage()
}

// imageArgv is what a replica of m runs in im: the project's command
// whole, else the image's Entrypoint followed by its Cmd.
func imageArgv(m store.ModelSpec, im *image.Image) ([]string, error) {
	if len(m.Command) > 0 {
		return m.Command, nil
	}
	argv := append(append([]string(nil), im.Config.Entrypoint...), im.Config.Cmd...)
	if len(argv) == 0 || argv[0] == "" {
		return nil, fmt.Errorf("image %s has no Entrypoint or Cmd, and the project no command: say what to run in command", im.Short())
	}
	return argv, nil
}

// imageDir is where a replica of m starts in im: the project's dir, else
// the image's WorkingDir, else /.
func imageDir(m store.ModelSpec, im *image.Image) string {
	switch {
	case m.Dir != "":
		return m.Dir
	case im.Config.WorkingDir != "":
		return filepath.Clean("/" + im.Config.WorkingDir)
	}
	return "/"
}

// imageEnviron is environ for a replica in im: the image's Env takes the
// place of the daemon's allowlisted variables and replica.passEnv (the
// host's PATH or LD_LIBRARY_PATH mean nothing inside an image).
//
// A GPU replica also finds the driver's files (driverfiles.go) on its PATH
// and LD_LIBRARY_PATH.
func imageEnviron(s backend.Spec, env map[string]string, port int, runAs *RunAs, dir string, im *image.Image) []string {
	vars := map[string]string{"PATH": defaultImagePath}
	var names []string
	for _, kv := range im.Config.Env {
		k, v, _ := strings.Cut(kv, "=")
		if k == "" {
			continue
		}
		vars[k] = v
		names = append(names, k)
	}
	names = append(names, "PATH")
	if len(s.GPUs) > 0 {
		vars["PATH"] += ":" + imageDriverBinDir
		vars["LD_LIBRARY_PATH"] = strings.TrimPrefix(vars["LD_LIBRARY_PATH"]+":"+imageDriverLibDir, ":")
		names = append(names, "LD_LIBRARY_PATH")
	}
	lookup := func(k string) (string, bool) {
		v, ok := vars[k]
		return v, ok
	}
	return environ(s, env, port, runAs, dir, names, lookup)
}

// imageInitConfig fills what cfg needs to start the model in im.
func (p *Process) imageInitConfig(cfg *replicainit.Config, env map[string]string, im *image.Image) error {
	spec, x := p.spec, p.box
	if !x.namespaces {
		return fmt.Errorf("a project with an image needs the sandbox's mount namespace, which this daemon cannot make (%v)", errBrief(x.sb.nsErr))
	}
	argv, err := imageArgv(spec.Model, im)
	if err != nil {
		return err
	}
	cfg.Path, cfg.Args = argv[0], argv
	cfg.Dir = imageDir(spec.Model, im)
	cfg.Env = imageEnviron(spec, env, p.port, x.runAs, x.dir, im)
	cfg.Image = &replicainit.ImageRoot{
		Root:  p.b.images.RootPath(im.Chain),
		Stage: p.b.images.MountDir(),
	}
	if len(spec.GPUs) > 0 {
		if cfg.Image.Devices, err = x.sb.devices.imageDevices(spec.GPUs); err != nil {
			return err
		}
		cfg.Image.Binds = driverFiles(cmp.Or(p.b.cfg.DriverRoot, "/"))
	}
	// The project's dir, at its own path, and the private HOME.
	if spec.Model.Dir != "" {
		cfg.Keep = append(cfg.Keep, spec.Model.Dir)
	}
	cfg.Keep = append(cfg.Keep, x.dir)
	return nil
}
