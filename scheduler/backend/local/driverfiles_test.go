package local

import (
	"os"
	"path/filepath"
	"slices"
	"testing"

	"inferd/scheduler/backend/local/replicainit"
)

// fakeDriverRoot lays out an NVIDIA driver's user-space files as a Debian
// host has them, with decoys the toolkit's search must not take.
func fakeDriverRoot(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	files := map[string]string{
		"usr/lib/x86_64-linux-gnu/libcuda.so.550.54.14":       "fake libcuda",
		"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.14":  "fake nvml",
		"usr/lib/x86_64-linux-gnu/libcudart.so.12":            "the CUDA runtime: the image's own, never the host's",
		"usr/lib64/libcuda.so.1":                              "a second copy in a later directory",
		"usr/lib/i386-linux-gnu/libcuda.so.1":                 "32-bit",
		"usr/bin/nvidia-smi":                                  "fake nvidia-smi",
		"usr/local/bin/nvidia-smi":                            "a later copy",
		"usr/lib/x86_64-linux-gnu/libnvidia-cfg.so.1.decoy/x": "a directory, not a library",
	}
	for p, body := range files {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, p), []byte(body), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	links := map[string]string{
		"usr/lib/x86_64-linux-gnu/libcuda.so.1":        "libcuda.so.550.54.14",
		"usr/lib/x86_64-linux-gnu/libcuda.so":          "libcuda.so.1",
		"usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1":   "libnvidia-ml.so.550.54.14",
		"usr/lib/x86_64-linux-gnu/libnvidia-nvvm.so.4": "/etc/passwd", // leads out of the root
	}
	for p, target := range links {
		if err := os.Symlink(target, filepath.Join(root, p)); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// TestDriverFilesAreFoundAsTheToolkitFindsThem: every file of each driver
// library in the first directory that has it (links bound as the file they
// name), the first copy of each tool, nothing outside the root, no CUDA
// runtime.
func TestDriverFilesAreFoundAsTheToolkitFindsThem(t *testing.T) {
	root := fakeDriverRoot(t)
	real, _ := filepath.EvalSymlinks(root)
	lib := func(name string) string { return filepath.Join(real, "usr/lib/x86_64-linux-gnu", name) }
	want := []replicainit.Bind{
		{Source: lib("libnvidia-ml.so.550.54.14"), Target: "/usr/local/nvidia/lib64/libnvidia-ml.so.1"},
		{Source: lib("libnvidia-ml.so.550.54.14"), Target: "/usr/local/nvidia/lib64/libnvidia-ml.so.550.54.14"},
		{Source: lib("libcuda.so.550.54.14"), Target: "/usr/local/nvidia/lib64/libcuda.so"},
		{Source: lib("libcuda.so.550.54.14"), Target: "/usr/local/nvidia/lib64/libcuda.so.1"},
		{Source: lib("libcuda.so.550.54.14"), Target: "/usr/local/nvidia/lib64/libcuda.so.550.54.14"},
		{Source: filepath.Join(real, "usr/bin/nvidia-smi"), Target: "/usr/local/nvidia/bin/nvidia-smi"},
	}
	if got := driverFiles(root); !slices.Equal(got, want) {
		t.Errorf("driverFiles found\n%v\nwant\n%v", got, want)
	}
	if got := driverFiles(t.TempDir()); len(got) != 0 {
		t.Errorf("a root without a driver gives %v, want nothing", got)
	}
}
