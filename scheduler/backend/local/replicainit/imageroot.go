package replicainit

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ImageRoot is the root filesystem a model runs in when its project names
// an image: the image's unpacked root, made the replica's / by pivot_root
// in its mount namespace. The model sees the image's files (read-only),
// its own /proc, a /dev of the ordinary nodes and its GPUs', a read-only
// /sys, a private tmpfs on /tmp, /var/tmp and /dev/shm, and what Keep
// binds in: its project's dir and its HOME, at their host paths.
type ImageRoot struct {
	// Root is the unpacked image on the host: the read-only lower layer
	// of an overlay whose upper layer is a tmpfs of the replica's own, so
	// that mount points can be made in it before it is made read-only.
	Root string
	// Stage is an empty host directory the init mounts that tmpfs on (in
	// its own mount namespace; other replicas never see it).
	Stage string
	// Devices are host device nodes bound into its /dev (its GPUs' nodes),
	// beside OrdinaryDevices.
	Devices []Bind
	// Binds are host files bound read-only into the root (the GPU driver's
	// libraries and tools).
	Binds []Bind
}

// Bind is a host file shown read-only at Target inside an image root.
type Bind struct {
	Source, Target string
}

// OrdinaryDevices are the nodes every image's /dev has, bound from the
// host's: the device cgroup allows them to every replica.
var OrdinaryDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom", "/dev/tty"}

// mountImage builds the replica's root from cfg.Image and pivots into it.
// / is already a slave of the host's mounts.
func mountImage(cfg Config) error {
	img := cfg.Image
	// Held open before anything is mounted, as mountPrivate does: the
	// model's dir and HOME as the host has them.
	var keep []kept
	defer func() {
		for _, k := range keep {
			unix.Close(k.fd)
		}
	}()
	for _, p := range cfg.Keep {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC, 0)
		if err != nil {
			return fmt.Errorf("replica init: open %s: %w", p, err)
		}
		keep = append(keep, kept{p, fd})
	}
	for _, p := range []string{img.Root, img.Stage} {
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("replica init: the image store's path %s has a character an overlay mount cannot take (',' ':' or '\\')", p)
		}
	}
	size := ""
	if cfg.TmpBytes > 0 {
		size = ",size=" + strconv.FormatInt(cfg.TmpBytes, 10)
	}
	if err := unix.Mount("tmpfs", img.Stage, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0700"+size); err != nil {
		return fmt.Errorf("replica init: mount the image's staging tmpfs: %w", err)
	}
	upper, work, root := img.Stage+"/upper", img.Stage+"/work", img.Stage+"/root"
	for _, d := range []string{upper, work, root} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return fmt.Errorf("replica init: %w", err)
		}
	}
	opts := "lowerdir=" + img.Root + ",upperdir=" + upper + ",workdir=" + work
	if err := unix.Mount("overlay", root, "overlay", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("replica init: mount the image's root (overlay): %w", err)
	}
	in := func(p string) string { return filepath.Join(root, p) }

	// /dev: a tmpfs with the ordinary nodes and the replica's GPUs',
	// each bound from the host's (the device cgroup still decides which
	// may be opened).
	if err := unix.Mount("tmpfs", in("/dev"), "tmpfs", unix.MS_NOSUID|unix.MS_NOEXEC, "mode=0755,size=65536"); err != nil {
		return fmt.Errorf("replica init: mount /dev: %w", err)
	}
	devices := img.Devices
	for _, dev := range OrdinaryDevices {
		devices = append(devices, Bind{Source: dev, Target: dev})
	}
	for _, dev := range devices {
		if _, err := os.Stat(dev.Source); err != nil {
			continue // this host has none (/dev/tty without a terminal)
		}
		if err := bindFile(dev.Source, in(dev.Target), 0); err != nil {
			return err
		}
	}
	for name, target := range map[string]string{"fd": "/proc/self/fd", "stdin": "/proc/self/fd/0", "stdout": "/proc/self/fd/1", "stderr": "/proc/self/fd/2"} {
		if err := os.Symlink(target, in("/dev/"+name)); err != nil {
			return fmt.Errorf("replica init: %w", err)
		}
	}
	opts = "mode=1777"
	if cfg.TmpBytes > 0 {
		opts += ",size=" + strconv.FormatInt(cfg.TmpBytes, 10)
	}
	for _, dir := range TmpDirs {
		if err := os.MkdirAll(in(dir), 0o1777); err != nil {
			return fmt.Errorf("replica init: %w", err)
		}
		if err := unix.Mount("tmpfs", in(dir), "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, opts); err != nil {
			return fmt.Errorf("replica init: mount a private tmpfs on %s: %w", dir, err)
		}
	}
	for _, b := range img.Binds {
		if err := bindFile(b.Source, in(b.Target), unix.MS_RDONLY); err != nil {
			return err
		}
	}
	for _, k := range keep {
		if err := bindBack(in(k.path), k.fd); err != nil {
			return err
		}
	}
	if err := unix.Mount("proc", in("/proc"), "proc", unix.MS_NOSUID|unix.MS_NODEV|unix.MS_NOEXEC, ""); err != nil {
		return fmt.Errorf("replica init: mount its own /proc: %w", err)
	}
	// /sys as containers have it: read-only (CUDA and NVML read it).
	if err := unix.Mount("/sys", in("/sys"), "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
		return fmt.Errorf("replica init: bind /sys: %w", err)
	}
	if err := remountReadOnly(in("/sys")); err != nil {
		return err
	}
	// The working directory, as docker makes a WorkingDir the image
	// lacks (a project's dir is bound in above).
	if cfg.Dir != "" {
		if err := os.MkdirAll(in(cfg.Dir), 0o755); err != nil {
			return fmt.Errorf("replica init: make the working directory %s: %w", cfg.Dir, err)
		}
	}
	// The image itself read-only: what a model writes goes to /tmp.
	if err := remountReadOnly(root); err != nil {
		return err
	}
	return pivot(root)
}

// kept is a host path held open (O_PATH) before mounts could hide it.
type kept struct {
	path string
	fd   int
}

// bindFile binds the host's src (a file or device node) at target, which
// it makes (an empty file), read-only when flags has MS_RDONLY.
func bindFile(src, target string, flags uintptr) error {
	if err := os.MkdirAll(filepath.Dir(target), 0o755); err != nil {
		return fmt.Errorf("replica init: %w", err)
	}
	f, err := os.OpenFile(target, os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		return fmt.Errorf("replica init: %w", err)
	}
	f.Close()
	if err := unix.Mount(src, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("replica init: bind %s: %w", src, err)
	}
	if flags&unix.MS_RDONLY != 0 {
		return remountReadOnly(target)
	}
	return nil
}

// remountReadOnly makes the mount at target read-only (and nosuid), for
// this mount namespace only.
func remountReadOnly(target string) error {
	if err := unix.Mount("", target, "", unix.MS_REMOUNT|unix.MS_BIND|unix.MS_RDONLY|unix.MS_NOSUID, ""); err != nil {
		return fmt.Errorf("replica init: make %s read-only: %w", target, err)
	}
	return nil
}

// pivot makes root the mount namespace's / and lets go of the host's,
// as runc does: pivot_root(".", ".") stacks the old root on the new one,
// and detaching it leaves only the new.
func pivot(root string) error {
	if err := unix.Chdir(root); err != nil {
		return fmt.Errorf("replica init: %w", err)
	}
	if err := unix.PivotRoot(".", "."); err != nil {
		return fmt.Errorf("replica init: pivot_root into the image: %w", err)
	}
	if err := unix.Unmount(".", unix.MNT_DETACH); err != nil {
		return fmt.Errorf("replica init: let go of the host's root: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return fmt.Errorf("replica init: %w", err)
	}
	return nil
}

// lookPath finds a program named without a slash on the PATH in env, as
// a shell in the image would; the daemon cannot, since the image is the
// model's / only in here.
func lookPath(name string, env []string) (string, error) {
	if strings.Contains(name, "/") {
		return name, nil
	}
	path := "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: not found in the image's PATH (%s)", name, path)
}
