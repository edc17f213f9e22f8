package local

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"golang.org/x/sys/unix"

	"inferd/gpu"
	"inferd/internal/testenv"
	"inferd/scheduler/backend"
)

// fakeDevDir makes NVIDIA device nodes in a temp dir, with the driver's
// real major (195) and the minors of two GPUs, and returns it. No driver
// answers them: an allowed open fails with ENXIO, a refused one with EPERM.
func fakeDevDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	nodes := []struct {
		name         string
		major, minor uint32
	}{
		{"nvidiactl", 195, 255},
		{"nvidia0", 195, 0},
		{"nvidia1", 195, 1},
		{"nvidia-modeset", 195, 254},
		{"nvidia-uvm", 237, 0}, // a dynamic major
		{"other", 10, 200},     // /dev/net/tun's numbers: no GPU, not ordinary
	}
	for _, n := range nodes {
		if err := unix.Mknod(filepath.Join(dir, n.name), unix.S_IFCHR|0o666, int(unix.Mkdev(n.major, n.minor))); err != nil {
			t.Fatalf("mknod %s: %v", n.name, err)
		}
	}
	return dir
}

// openResults runs a replica of b given gpus that tries to open each node
// (names in dev, or absolute paths), and returns what each open answered:
// "ok", or the shell's error text.
func openResults(t *testing.T, b *Backend, id string, gpus []string, dev string, nodes []string) map[string]string {
	t.Helper()
	var script strings.Builder
	for _, n := range nodes {
		path := n
		if !filepath.IsAbs(n) {
			path = filepath.Join(dev, n)
		}
		// The subshell's redirection is the open; its error goes to the log.
		script.WriteString("if (exec 3<>" + path + ") 2>/dev/null; then echo " + n + "=ok; else (exec 3<>" + path + ") 2>&1 | sed 's|^|" + n + "=|'; fi\n")
	}
	script.WriteString("echo done\nexec sleep 1000\n")
	spec := sandboxSpec(id, script.String())
	spec.GPUs = gpus
	p := startModel(t, b, spec)
	text := waitLog(t, b, p, "done")
	out := map[string]string{}
	for _, line := range strings.Split(text, "\n") {
		if k, v, ok := strings.Cut(line, "="); ok {
			out[k] = v
		}
	}
	return out
}

func TestReplicaOpensOnlyItsOwnGPUNodes(t *testing.T) {
	needRoot(t)
	dev := fakeDevDir(t)
	gpus := gpu.Simulated([]gpu.SimulatedGPU{{}, {}})
	uuid0 := gpus.Devices()[0].UUID
	nodes := []string{"nvidiactl", "nvidia0", "nvidia1", "nvidia-modeset", "nvidia-uvm", "other", "/dev/null", "/dev/urandom"}

	tests := []struct {
		name    string
		gpus    []string
		allowed []string // the rest are refused
	}{
		{"a replica given GPU 0", []string{uuid0}, []string{"nvidiactl", "nvidia0", "nvidia-uvm", "/dev/null", "/dev/urandom"}},
		{"a CPU replica", nil, []string{"/dev/null", "/dev/urandom"}},
	}
	// Each way of enforcing the rules this host offers: the v1 devices
	// controller where mounted (as here), and a BPF program on the v2
	// cgroup, which pure v2 hosts get (on a hybrid host both apply).
	for _, mode := range []struct {
		name string
		mode deviceMode
	}{{"cgroup v1 devices", devicesV1}, {"cgroup v2 BPF program", devicesBPF}} {
		t.Run(mode.name, func(t *testing.T) {
			b := testBackendWith(t, func(c *Config) { c.DevDir, c.GPUs = dev, gpus })
			cg := b.sb.cgroups
			switch {
			case mode.mode == devicesV1 && (cg == nil || cg.v1["devices"].base == ""):
				testenv.Missing(t, "a cgroup v1 devices controller")
			case mode.mode == devicesBPF && (cg == nil || cg.v2 == ""):
				testenv.Missing(t, "a cgroup v2 per replica")
			}
			b.sb.devices.mode = mode.mode
			for k, tc := range tests {
				t.Run(tc.name, func(t *testing.T) {
					got := openResults(t, b, fmt.Sprint("dev-", k), tc.gpus, dev, nodes)
					for _, n := range nodes {
						res, ok := got[n]
						if !ok {
							t.Errorf("%s: no result in the log: %v", n, got)
							continue
						}
						refused := strings.Contains(res, "Operation not permitted")
						if want := !slices.Contains(tc.allowed, n); refused != want {
							t.Errorf("%s: open answered %q; want refused (EPERM) %v", n, res, want)
						}
					}
				})
			}
			ps := b.Protections()
			if i := slices.IndexFunc(ps, func(p backend.Protection) bool { return p.Name == backend.ProtectionDevices }); i < 0 || !ps[i].On {
				t.Errorf("protections %+v, want device isolation on", ps)
			}
		})
	}
}

func TestDeviceProgramEncodesEachRule(t *testing.T) {
	code, err := deviceProgram([]string{"c 1:3 rwm", "c 136:* rwm"})
	if err != nil {
		t.Fatal(err)
	}
	// 4 loads, 5 for a rule with a minor, 4 for one without, 2 at the end.
	if got, want := len(code)/bpfInsnSize, 4+5+4+2; got != want {
		t.Errorf("%d instructions, want %d", got, want)
	}
	for _, bad := range []string{"b 8:0 rwm", "c x:1 rwm", "c 1 rwm", "c 1:y rwm"} {
		if _, err := deviceProgram([]string{bad}); err == nil {
			t.Errorf("rule %q: no error", bad)
		}
	}
}

func TestDeviceRulesApplyOnlyWhereTheBoxHasNVIDIADevices(t *testing.T) {
	none := &deviceIsolation{dir: t.TempDir()}
	if none.applies() {
		t.Error("a box with no GPUs and no nvidiactl gets device rules")
	}
	withCtl := &deviceIsolation{dir: t.TempDir()}
	if err := os.WriteFile(filepath.Join(withCtl.dir, "nvidiactl"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if !withCtl.applies() {
		t.Error("a box with nvidiactl (driver loaded, NVML not yet up) gets no device rules")
	}
	sim := &deviceIsolation{dir: t.TempDir(), gpus: gpu.Simulated([]gpu.SimulatedGPU{{}})}
	if !sim.applies() {
		t.Error("a box with GPUs gets no device rules")
	}
	if _, err := sim.rules([]string{"GPU-gone"}); err == nil {
		t.Error("rules for a GPU the inventory does not list: no error")
	}
}

func TestMIGReplicaIsAllowedItsGPUAndItsCapabilityFiles(t *testing.T) {
	needRoot(t) // mknod
	dev := t.TempDir()
	if err := os.Mkdir(filepath.Join(dev, "nvidia-caps"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, m := range []uint32{1, 12, 13, 21, 22} {
		if err := unix.Mknod(filepath.Join(dev, "nvidia-caps", fmt.Sprint("nvidia-cap", m)), unix.S_IFCHR|0o444, int(unix.Mkdev(238, m))); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name      string
		capMinors []int
		want      []string
		refused   []string
	}{
		{"its GPU and compute instance's capability files", []int{12, 13},
			[]string{"c 195:255 rwm", "c 195:3 rwm", "c 238:12 rwm", "c 238:13 rwm"}, []string{"c 238:1 rwm", "c 238:21 rwm", "c 238:22 rwm"}},
		{"every capability file where discovery could not tell", nil,
			[]string{"c 195:3 rwm", "c 238:1 rwm", "c 238:12 rwm", "c 238:13 rwm", "c 238:21 rwm", "c 238:22 rwm"}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			inv := fixedInventory{{Index: 1, UUID: "MIG-1", Minor: 3, MIG: true, Parent: "GPU-b", CapMinors: tc.capMinors}}
			rules, err := (&deviceIsolation{dir: dev, gpus: inv}).rules([]string{"MIG-1"})
			if err != nil {
				t.Fatal(err)
			}
			for _, want := range tc.want {
				if !slices.Contains(rules, want) {
					t.Errorf("rules %v lack %q", rules, want)
				}
			}
			for _, no := range tc.refused {
				if slices.Contains(rules, no) {
					t.Errorf("rules %v allow %q", rules, no)
				}
			}
		})
	}
}

// fixedInventory is an Inventory of the devices it holds.
type fixedInventory []gpu.Device

func (f fixedInventory) Devices() []gpu.Device { return f }
