package local

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"golang.org/x/sys/unix"

	"inferd/gpu"
	"inferd/scheduler/backend/local/replicainit"
)

// Device isolation: CUDA_VISIBLE_DEVICES only asks a model to use its GPUs;
// a model that unsets it, or talks to NVML, could use every GPU of the box.
// So whenever the box has NVIDIA devices, each replica's device cgroup lets
// it open only the ordinary devices every process needs and, for a replica
// with GPUs, the NVIDIA control nodes and its own GPUs' nodes, as the NVIDIA
// container toolkit and Slurm's ConstrainDevices do. A CPU replica opens no
// NVIDIA node at all.
//
// The rules are the cgroup v1 devices controller's (deny all, then allow
// each) where the host mounts it; otherwise (pure cgroup v2) the same rules
// become a BPF device program attached to the replica's v2 cgroup
// (devicebpf.go). Where neither can be had, Protections says device
// isolation is off.
//
// MIG: a MIG device is opened through its GPU's node and two capability
// files, nvidia-caps/nvidia-cap<N> of its GPU instance and of its compute
// instance (gpu.Device.CapMinors, from the driver's map). Where discovery
// could not tell them, the replica is allowed every capability file, so it
// could reach the other MIG devices of the same GPU (never another GPU). docs/gpu.md says so.

// nvidiaMajor is the NVIDIA driver's fixed character major: /dev/nvidia<N>
// is 195:N and /dev/nvidiactl 195:255. nvidia-uvm and nvidia-caps get
// dynamic majors, read from their nodes.
const nvidiaMajor = 195

// nvidiactlMinor is /dev/nvidiactl's minor.
const nvidiactlMinor = 255

// ordinaryDevices are the character devices every replica may open: the
// container runtimes' default allowlist (runc's), without mknod.
var ordinaryDevices = []string{
	"c 1:3 rwm",   // null
	"c 1:5 rwm",   // zero
	"c 1:7 rwm",   // full
	"c 1:8 rwm",   // random
	"c 1:9 rwm",   // urandom
	"c 5:0 rwm",   // tty
	"c 5:2 rwm",   // ptmx
	"c 136:* rwm", // pts
}

// deviceIsolation makes the device rules of replicas.
type deviceIsolation struct {
	dir  string    // where device nodes are: /dev, or a test's
	gpus Inventory // nil = none
	mode deviceMode
	why  string // why mode is devicesOff
}

// deviceMode is how replicas' device rules are enforced.
type deviceMode int

const (
	devicesOff deviceMode = iota // no way to: Protections says why
	devicesV1                    // the v1 devices controller
	devicesBPF                   // a BPF program on the v2 cgroup
)

// newDeviceIsolation decides how device rules are enforced with cg's
// cgroups: v1 where the devices controller is mounted, else a BPF program
// where one can be loaded (tried once, here).
func newDeviceIsolation(dir string, gpus Inventory, cg *cgroups, cgWhy string) *deviceIsolation {
	d := &deviceIsolation{dir: dir, gpus: gpus}
	switch {
	case cg == nil:
		d.why = "no cgroup per replica (" + cgWhy + ")"
	case cg.v1["devices"].base != "":
		d.mode = devicesV1
	case cg.v2 == "":
		d.why = "no cgroup v2 per replica and no cgroup v1 devices controller"
	default:
		fd, err := loadDeviceProgram(ordinaryDevices)
		if err != nil {
			d.why = fmt.Sprintf("no cgroup v1 devices controller, and no BPF device program can be loaded for cgroup v2 (%v; it needs CAP_BPF or CAP_SYS_ADMIN)", err)
			break
		}
		unix.Close(fd)
		d.mode = devicesBPF
	}
	return d
}

// applies reports whether the box has NVIDIA devices (or simulated GPUs):
// only then are replicas' devices restricted. It is asked at every launch,
// so a driver that comes late is covered from the next replica on.
func (d *deviceIsolation) applies() bool {
	if d.gpus != nil && len(d.gpus.Devices()) > 0 {
		return true
	}
	_, err := os.Stat(filepath.Join(d.dir, "nvidiactl"))
	return err == nil
}

// rules are the devices.allow lines of a replica given gpus (their UUIDs).
func (d *deviceIsolation) rules(gpus []string) ([]string, error) {
	out := slices.Clone(ordinaryDevices)
	if len(gpus) == 0 {
		return out, nil
	}
	minors, nodes, err := d.gpuNodes(gpus)
	if err != nil {
		return nil, err
	}
	out = append(out, fmt.Sprintf("c %d:%d rwm", nvidiaMajor, nvidiactlMinor))
	for _, m := range minors {
		out = append(out, fmt.Sprintf("c %d:%d rwm", nvidiaMajor, m))
	}
	for _, n := range nodes {
		rule, err := charRule(filepath.Join(d.dir, n))
		if errors.Is(err, os.ErrNotExist) {
			continue // nvidia-uvm not loaded yet: no node to allow
		}
		if err != nil {
			return nil, fmt.Errorf("device rules: %w", err)
		}
		if rule != "" {
			out = append(out, rule)
		}
	}
	return out, nil
}

// gpuNodes are what a replica given gpus may open besides nvidiactl: the
// minors of its GPUs' nodes (/dev/nvidia<minor>), and the names under
// d.dir of nvidia-uvm, nvidia-uvm-tools and its MIG capability files.
func (d *deviceIsolation) gpuNodes(gpus []string) ([]int, []string, error) {
	byUUID := map[string]int{}
	allCaps := false // a MIG device whose capability files are not known
	var caps []string
	var devs []gpu.Device
	if d.gpus != nil {
		devs = d.gpus.Devices()
	}
	for k, dev := range devs {
		byUUID[dev.UUID] = k
	}
	var minors []int
	for _, uuid := range gpus {
		k, ok := byUUID[uuid]
		if !ok {
			return nil, nil, fmt.Errorf("device rules: GPU %s is no longer listed", uuid)
		}
		minors = append(minors, devs[k].Minor)
		if devs[k].MIG {
			allCaps = allCaps || len(devs[k].CapMinors) == 0
			for _, m := range devs[k].CapMinors {
				caps = append(caps, fmt.Sprint("nvidia-cap", m))
			}
		}
	}
	if allCaps {
		entries, err := os.ReadDir(filepath.Join(d.dir, "nvidia-caps"))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, nil, fmt.Errorf("device rules: %w", err)
		}
		caps = caps[:0]
		for _, e := range entries {
			caps = append(caps, e.Name())
		}
	}
	nodes := []string{"nvidia-uvm", "nvidia-uvm-tools"}
	for _, c := range caps {
		nodes = append(nodes, filepath.Join("nvidia-caps", c))
	}
	return minors, nodes, nil
}

// imageDevices are the GPU nodes bound into the /dev of a replica given
// gpus that runs in an image, as the NVIDIA container toolkit mounts them
// into a container: nvidiactl, its GPUs' nodes, nvidia-uvm(-tools) and
// its MIG capability files, those of them this box has.
func (d *deviceIsolation) imageDevices(gpus []string) ([]replicainit.Bind, error) {
	if len(gpus) == 0 {
		return nil, nil
	}
	minors, nodes, err := d.gpuNodes(gpus)
	if err != nil {
		return nil, err
	}
	names := []string{"nvidiactl"}
	for _, m := range minors {
		names = append(names, fmt.Sprint("nvidia", m))
	}
	var out []replicainit.Bind
	for _, n := range append(names, nodes...) {
		src := filepath.Join(d.dir, n)
		if _, err := os.Stat(src); err == nil {
			out = append(out, replicainit.Bind{Source: src, Target: "/dev/" + n})
		}
	}
	return out, nil
}

// charRule is the allow line of the character device at path; "" when it
// is not one.
func charRule(path string) (string, error) {
	var st unix.Stat_t
	if err := unix.Stat(path, &st); err != nil {
		return "", &os.PathError{Op: "stat", Path: path, Err: err}
	}
	if st.Mode&unix.S_IFMT != unix.S_IFCHR {
		return "", nil
	}
	return fmt.Sprintf("c %d:%d rwm", unix.Major(st.Rdev), unix.Minor(st.Rdev)), nil
}

// apply restricts rc, a replica's new cgroups with nothing in them yet, to
// the devices of a replica given gpus, when the box has NVIDIA devices.
func (d *deviceIsolation) apply(rc *replicaCgroup, gpus []string) error {
	if d.mode == devicesOff || !d.applies() {
		return nil
	}
	rules, err := d.rules(gpus)
	if err != nil {
		return err
	}
	if d.mode == devicesBPF {
		return attachDeviceProgram(rc.v2, rules)
	}
	dir := rc.v1["devices"]
	if err := writeCgroup(dir, "devices.deny", "a"); err != nil {
		return err
	}
	for _, r := range rules {
		if err := writeCgroup(dir, "devices.allow", r); err != nil {
			return err
		}
	}
	return nil
}
