package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"inferd/internal/testenv"
)

// Simulated GPU UUIDs are fixed by their index (gpu.Simulated).
const (
	simGPU0 = "GPU-sim-0000-0000-0000-000000000000"
	simGPU1 = "GPU-sim-0001-0000-0000-000000000001"
)

// TestGPUPlacementAndEvictionEndToEnd runs three echo projects on two
// simulated GPUs: "resident" keeps GPU 0 by its minReplicas, "shared" takes
// 8000 MiB of GPU 1, and "whole" needs all of a GPU, so its call waits until
// shared's idle replica is evicted, and later shared's call waits for
// whole's. Each replica reports the GPU it was pinned to.
func TestGPUPlacementAndEvictionEndToEnd(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(30*time.Second)+"\nlongPollWait: "+scaledSetting(10*time.Second)+"\nreplica:\n  stopGrace: 2s\n"+
		"gpu:\n  simulate:\n    - {name: Sim A, memoryMiB: 16384}\n    - {name: Sim B, memoryMiB: 16384}\n")
	mark := marker()
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	out := d.apply("projects:\n" +
		echoProject("resident", "acme", "mk-resident", echo, mark, "") + "    gpus: 1\n    minReplicas: 1\n    maxReplicas: 1\n" +
		echoProject("shared", "acme", "mk-shared", echo, mark, "") + "    gpuMemoryMiB: 8000\n    maxReplicas: 1\n    idleTimeout: 600\n" +
		echoProject("whole", "acme", "mk-whole", echo, mark, "") + "    gpus: 1\n    maxReplicas: 1\n    idleTimeout: 600\n" +
		echoProject("huge", "acme", "mk-huge", echo, mark, "") + "    gpus: 3\n")
	// The minimums fit: the one warning is for huge, which no replica fits.
	var warnings []string
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, "warning:") {
			warnings = append(warnings, l)
		}
	}
	if len(warnings) != 1 || !strings.HasPrefix(warnings[0], "warning: project huge: gpus: 3 per replica, but this machine has 2 GPU(s)") {
		t.Errorf("apply warned %q, want only of huge's gpus:\n%s", warnings, out)
	}
	c := inferenceClient{t: t, base: d.base, key: key}
	// gpuOf runs a call on the project and returns the GPUs its replica saw.
	gpuOf := func(modelKey string) (cuda string) {
		t.Helper()
		r := c.start(modelKey, `{"env":"CUDA_VISIBLE_DEVICES"}`, false)
		if r["message"] != "success" {
			t.Fatalf("%s: %v", modelKey, r)
		}
		cuda, _ = output(t, r)["env"].(string)
		nv := c.start(modelKey, `{"env":"NVIDIA_VISIBLE_DEVICES"}`, false)
		if nv["message"] != "success" || output(t, nv)["env"] != cuda {
			t.Fatalf("%s: NVIDIA_VISIBLE_DEVICES %v differs from CUDA_VISIBLE_DEVICES %q", modelKey, nv, cuda)
		}
		return cuda
	}

	t.Run("a project needing more GPUs than the machine has fails at once", func(t *testing.T) {
		r := c.start("mk-huge", `{}`, false)
		if r["message"] != "error: project needs 3 GPUs, this machine has 2" {
			t.Fatalf("start: %v", r)
		}
	})
	t.Run("the minimum replica is pinned to a whole GPU", func(t *testing.T) {
		if got := gpuOf("mk-resident"); got != simGPU0 {
			t.Fatalf("resident sees %q, want %s", got, simGPU0)
		}
	})
	t.Run("a share by memory goes on the GPU left", func(t *testing.T) {
		if got := gpuOf("mk-shared"); got != simGPU1 {
			t.Fatalf("shared sees %q, want %s", got, simGPU1)
		}
	})
	t.Run("a whole-GPU call waits, evicts the idle share, then succeeds", func(t *testing.T) {
		r := c.start("mk-whole", `{"env":"CUDA_VISIBLE_DEVICES"}`, true)
		if !strings.Contains(d.logs.waitFor(t, `"waiting for GPU"`, 30*time.Second), `"project":"whole"`) {
			t.Error("the first project waiting for GPU is not whole")
		}
		if line := d.logs.waitFor(t, "evicting idle replica", 30*time.Second); !strings.Contains(line, `"project":"shared"`) || !strings.Contains(line, `"for":"whole"`) {
			t.Errorf("eviction: %s", line)
		}
		res := c.waitResult(r["callID"].(string))
		if res["message"] != "success" || output(t, res)["env"] != simGPU1 {
			t.Fatalf("whole's call: %v", res)
		}
		if got := gpuOf("mk-resident"); got != simGPU0 {
			t.Errorf("resident moved to %q", got)
		}
	})
	t.Run("the share's next call waits for the idle whole replica to go", func(t *testing.T) {
		if got := gpuOf("mk-shared"); got != simGPU1 {
			t.Fatalf("shared sees %q, want %s", got, simGPU1)
		}
		if line := d.logs.waitFor(t, `"for":"shared"`, 30*time.Second); !strings.Contains(line, `"project":"whole"`) {
			t.Errorf("eviction: %s", line)
		}
	})
	t.Run("apply warns when minimums cannot all fit", func(t *testing.T) {
		out := d.apply("projects:\n" + echoProject("greedy", "acme", "mk-greedy", echo, mark, "") + "    gpus: 1\n    minReplicas: 2\n    maxReplicas: 2\n")
		if !strings.Contains(out, "warning: minReplicas need 3 GPU replicas at once but only 2 fit on this machine's 2 GPUs (projects greedy, resident)") {
			t.Errorf("apply output:\n%s", out)
		}
	})
}

// TestGPUProbeSeesOnlyItsPinnedGPU applies examples/gpuprobe/project.yaml as
// shipped on a simulated GPU: the replica is pinned by UUID and the status
// reports the device healthy. On a real GPU box docs/gpu.md ("How to verify
// on a GPU box") runs the same probe to see what CUDA and NVML show it.
func TestGPUProbeSeesOnlyItsPinnedGPU(t *testing.T) {
	t.Parallel()
	manifest := shippedManifest(t, "examples/gpuprobe/project.yaml")
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(2*time.Minute)+"\ngpu:\n  simulate:\n    - {name: Sim A, memoryMiB: 16384}\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("demo", true)
	if out, err := d.cli("apply", "-f", manifest); err != nil || !strings.Contains(out, "project gpuprobe (team demo): created") {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	c := inferenceClient{t: t, base: d.base, key: key}
	r := c.start("mk-gpuprobe-1", `{}`, false)
	if r["message"] != "success" {
		t.Fatalf("start: %v", r)
	}
	if out := output(t, r); out["cudaVisibleDevices"] != simGPU0 || out["allocatedMiB"] != 0.0 {
		t.Errorf("probe: %v, want it pinned to %s holding nothing", out, simGPU0)
	}
	var gpus struct {
		Results []struct {
			UUID    string `json:"uuid"`
			Healthy bool   `json:"healthy"`
			Held    bool   `json:"held"`
		} `json:"results"`
	}
	code, body := doRaw(t, "GET", d.base+"/v1/status/gpus", map[string]string{"X-Service-API-Key": key}, "")
	if err := json.Unmarshal(body, &gpus); code != 200 || err != nil {
		t.Fatalf("/v1/status/gpus: %d %v %s", code, err, body)
	}
	if len(gpus.Results) != 1 || gpus.Results[0].UUID != simGPU0 || !gpus.Results[0].Healthy || !gpus.Results[0].Held {
		t.Errorf("/v1/status/gpus = %+v, want the one GPU healthy and held", gpus.Results)
	}
}

// TestReplicasOpenOnlyTheirOwnGPUNodes runs the real daemon, as root, with two
// simulated GPUs whose device nodes are fake ones (mknod, the NVIDIA major
// 195, minors 0 and 1) in gpu.devDir: a replica pinned to GPU 0 opens its
// node and nvidiactl (no driver answers: ENXIO) and is refused (EPERM) on
// GPU 1's; a CPU replica is refused on every NVIDIA node.
func TestReplicasOpenOnlyTheirOwnGPUNodes(t *testing.T) {
	t.Parallel()
	testenv.NeedRoot(t, "device rules need a cgroup, and mknod needs root")
	echo := echoDir(t)
	dev := filepath.Join(t.TempDir(), "dev")
	if err := os.Mkdir(dev, 0o755); err != nil {
		t.Fatal(err)
	}
	// The models run under uids of their own: they must reach the nodes.
	for p := dev; p != os.TempDir() && p != "/"; p = filepath.Dir(p) {
		if err := os.Chmod(p, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for name, minor := range map[string]uint32{"nvidiactl": 255, "nvidia0": 0, "nvidia1": 1} {
		if err := unix.Mknod(filepath.Join(dev, name), unix.S_IFCHR|0o666, int(unix.Mkdev(195, minor))); err != nil {
			t.Fatalf("mknod %s: %v", name, err)
		}
	}
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(30*time.Second)+"\ngpu:\n  devDir: "+dev+"\n  simulate:\n    - {name: Sim A, memoryMiB: 16384}\n    - {name: Sim B, memoryMiB: 16384}\n")
	d := startDaemon(t, dir, cfg)
	if out, err := d.cli("doctor"); !strings.Contains(out, "ok    devices") {
		t.Errorf("doctor does not report device isolation on (%v):\n%s", err, out)
	}
	key := d.createKey("acme", false)
	mark := marker()
	d.apply("projects:\n" +
		echoProject("on-gpu", "acme", "mk-on-gpu", echo, mark, "") + "    gpus: 1\n    maxReplicas: 1\n" +
		echoProject("on-cpu", "acme", "mk-on-cpu", echo, mark, "") + "    maxReplicas: 1\n")
	c := inferenceClient{t: t, base: d.base, key: key}
	open := func(modelKey, node string) string {
		t.Helper()
		r := c.start(modelKey, `{"read":"`+filepath.Join(dev, node)+`"}`, false)
		if r["message"] != "success" {
			t.Fatalf("%s: %v", modelKey, r)
		}
		s, _ := output(t, r)["read"].(string)
		return s
	}
	const refused, noDriver = "error: Operation not permitted", "error: No such device or address"
	for _, tc := range []struct{ modelKey, node, want string }{
		{"mk-on-gpu", "nvidia0", noDriver},
		{"mk-on-gpu", "nvidiactl", noDriver},
		{"mk-on-gpu", "nvidia1", refused},
		{"mk-on-cpu", "nvidia0", refused},
		{"mk-on-cpu", "nvidiactl", refused},
	} {
		if got := open(tc.modelKey, tc.node); got != tc.want {
			t.Errorf("%s opening %s: %q, want %q", tc.modelKey, tc.node, got, tc.want)
		}
	}
}

// TestDoctorAsksAGPUProjectsPythonAboutCUDA: doctor runs a GPU project's
// Python (here a fake one that answers as a CUDA torch would, but only
// with the GPU pinned) and reports what torch says; a CPU project gets no
// such line.
func TestDoctorAsksAGPUProjectsPythonAboutCUDA(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	py := filepath.Join(t.TempDir(), "python3")
	script := "#!/bin/sh\n[ \"$CUDA_VISIBLE_DEVICES\" = " + simGPU0 + " ] && a=true || a=false\n" +
		"echo 'inferd-cuda {\"torch\": \"2.3.1+cu121\", \"cuda\": \"12.1\", \"available\": '$a'}'\n"
	if err := os.WriteFile(py, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	_, cfg := newDaemonDir(t, "replica:\n  user: root\ngpu:\n  simulate:\n    - {name: Sim A, memoryMiB: 16384}\n")
	manifest := filepath.Join(t.TempDir(), "m.yaml")
	projects := "projects:\n" +
		"  - {id: on-gpu, team: demo, modelKey: mk-g, command: [" + py + ", server.py], dir: " + echo + ", gpus: 1}\n" +
		"  - {id: on-cpu, team: demo, modelKey: mk-c, command: [python3, server.py], dir: " + echo + "}\n"
	if err := os.WriteFile(manifest, []byte(projects), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLI(cfg, "apply", "-f", manifest); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	out, _ := runCLI(cfg, "doctor")
	if want := "ok    cuda         on-gpu: torch 2.3.1+cu121 (CUDA 12.1) in " + py + " sees its GPU " + simGPU0; !strings.Contains(out, want) {
		t.Errorf("doctor lacks %q:\n%s", want, out)
	}
	if strings.Contains(out, "cuda        on-cpu") {
		t.Errorf("doctor asked a CPU project about CUDA:\n%s", out)
	}
}
