package cli

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"inferd/gpu"
	"inferd/store"
)

// fakePython writes a script named python3 that answers the CUDA probe as a
// torch would: torch version ver, CUDA build cuda ("None" for a CPU-only
// build), and is_available() avail, but only when CUDA_VISIBLE_DEVICES pins
// GPU-pinned (else false), as CUDA would not see an unpinned GPU there.
func fakePython(t *testing.T, ver, cuda, avail string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "python3")
	if cuda == "None" {
		cuda = "null" // json.dumps(None)
	} else {
		cuda = `"` + cuda + `"`
	}
	script := `#!/bin/sh
[ "$1" = -c ] || exit 2
avail=false
[ "$CUDA_VISIBLE_DEVICES" = GPU-pinned ] && avail=` + avail + `
echo 'inferd-cuda {"torch": "` + ver + `", "cuda": ` + cuda + `, "available": '$avail'}'
`
	if err := os.WriteFile(path, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestDoctorAsksTheModelsPythonWhetherItSeesCUDA(t *testing.T) {
	real := []gpu.Device{{Index: 0, UUID: "GPU-pinned", MemoryTotalMiB: 81559}}
	sim := []gpu.Device{{Index: 0, UUID: "GPU-pinned", MemoryTotalMiB: 16384, Simulated: true}}
	lost := []gpu.Device{{Index: 0, UUID: "GPU-pinned", MemoryTotalMiB: 81559, Problem: "lost"}}
	noTorch := filepath.Join(t.TempDir(), "python3")
	if err := os.WriteFile(noTorch, []byte("#!/bin/sh\necho \"ModuleNotFoundError: No module named 'torch'\" >&2\nexit 1\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	direct := func(py string) store.ModelSpec {
		return store.ModelSpec{Command: []string{py, "server.py"}, Dir: "/", GPUs: 1}
	}

	tests := []struct {
		name       string
		model      store.ModelSpec
		devs       []gpu.Device
		wantStatus string
		want       []string
	}{
		{"a CUDA torch that sees the pinned GPU", direct(fakePython(t, "2.3.1+cu121", "12.1", "true")), real,
			"ok", []string{"torch 2.3.1+cu121 (CUDA 12.1)", "sees its GPU GPU-pinned"}},
		{"Debian's CPU-only torch 1.13", direct(fakePython(t, "1.13.1", "None", "false")), real,
			"warn", []string{"CPU-only build", "older than 2.0", "docs/gpu.md"}},
		{"a CUDA torch older than 2.0", direct(fakePython(t, "1.12.0+cu113", "11.3", "true")), real,
			"warn", []string{"older than 2.0"}},
		{"a CUDA torch that does not see the GPU", direct(fakePython(t, "2.3.1", "12.1", "false")), real,
			"warn", []string{"does not see the pinned GPU GPU-pinned", "nvidia_uvm", "replica.passEnv"}},
		{"no torch at all", direct(noTorch), real,
			"warn", []string{"No module named 'torch'", "CUDA-enabled torch >= 2.0"}},
		{"the interpreter named in env, as examples/digits does",
			store.ModelSpec{Command: []string{"/bin/sh", "-c", `exec "$DIGITS_PYTHON" server.py`}, Dir: "/", GPUMemoryMiB: 4096,
				Env: map[string]string{"DIGITS_PYTHON": fakePython(t, "2.4.0", "12.4", "true")}}, real,
			"ok", []string{"torch 2.4.0 (CUDA 12.4)", "sees its GPU"}},
		{"an interpreter doctor cannot tell", store.ModelSpec{Command: []string{"./serve"}, Dir: "/", GPUs: 1}, real,
			"warn", []string{"cannot tell which Python", "_PYTHON"}},
		{"simulated GPUs: CUDA seeing none is expected", direct(fakePython(t, "2.3.1", "12.1", "false")), sim,
			"ok", []string{"simulated"}},
		{"a box without GPUs", direct(fakePython(t, "2.3.1", "12.1", "true")), nil,
			"ok", []string{"skipped", "no usable GPU"}},
		{"a box whose only GPU is lost", direct(fakePython(t, "2.3.1", "12.1", "true")), lost,
			"ok", []string{"skipped"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := store.Project{ID: "gpu-model", TeamID: "demo", Model: tc.model}
			status, text := cudaCheck(context.Background(), p, tc.devs, nil, nil)
			if status != tc.wantStatus {
				t.Errorf("status %s, want %s: %s", status, tc.wantStatus, text)
			}
			for _, w := range tc.want {
				if !strings.Contains(text, w) {
					t.Errorf("%q does not say %q", text, w)
				}
			}
		})
	}
}
