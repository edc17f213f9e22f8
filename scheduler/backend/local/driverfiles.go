package local

import (
	"os"
	"path/filepath"
	"strings"

	"inferd/scheduler/backend/local/replicainit"
)

// A GPU model in an image needs the NVIDIA driver's user-space libraries
// (libcuda, libnvidia-ml, ...), which must match the host's kernel module
// and so can never come with the image. The NVIDIA container toolkit finds
// them on the host and mounts them into each GPU container; so does inferd,
// with the toolkit's lists for the compute and utility capabilities
// (libnvidia-container's nvc_info.c) and its fallback search of the usual
// library directories. They are bound read-only into /usr/local/nvidia/lib64
// and /usr/local/nvidia/bin of the replica's root, which LD_LIBRARY_PATH and
// PATH name (the layout GKE and the toolkit's older runtime use), so no
// ldconfig has to run in an image that may have none.

// driverLibraries are the toolkit's libraries for the compute and utility
// capabilities, by the name their files start with.
var driverLibraries = []string{
	"libnvidia-ml.so", "libnvidia-cfg.so", "libcuda.so", "libcudadebugger.so",
	"libnvidia-opencl.so", "libnvidia-gpucomp.so", "libnvidia-ptxjitcompiler.so",
	"libnvidia-fatbinaryloader.so", "libnvidia-allocator.so", "libnvidia-compiler.so",
	"libnvidia-pkcs11.so", "libnvidia-pkcs11-openssl3.so", "libnvidia-nvvm.so",
	"libnvidia-nscq.so",
}

// driverTools are the toolkit's utility programs.
var driverTools = []string{"nvidia-smi", "nvidia-debugdump", "nvidia-persistenced", "nvidia-cuda-mps-control", "nvidia-cuda-mps-server"}

// driverLibDirs and driverBinDirs are searched in order; the first that has
// a library (or a tool) gives all of its files, so a 32-bit copy elsewhere
// is never mixed in.
var (
	driverLibDirs = []string{"/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/lib/x86_64-linux-gnu", "/lib/aarch64-linux-gnu", "/lib64", "/usr/lib", "/lib", "/usr/local/nvidia/lib64"}
	driverBinDirs = []string{"/usr/bin", "/usr/sbin", "/usr/local/bin", "/bin", "/sbin", "/usr/local/nvidia/bin"}
)

// Where the driver's files show inside an image.
const (
	imageDriverLibDir = "/usr/local/nvidia/lib64"
	imageDriverBinDir = "/usr/local/nvidia/bin"
)

// driverFiles finds the driver's libraries and tools on the host whose
// root is root ("/", or a test's fake one) and says where each shows in an
// image: every file named after a library (libcuda.so.1 and
// libcuda.so.550.54.14 both, the link bound as the file it names) and
// every tool.
func driverFiles(root string) []replicainit.Bind {
	var out []replicainit.Bind
	for _, lib := range driverLibraries {
		for _, dir := range driverLibDirs {
			matches, _ := filepath.Glob(filepath.Join(root, dir, lib+"*"))
			found := false
			for _, m := range matches {
				name := filepath.Base(m)
				if name != lib && !strings.HasPrefix(name, lib+".") {
					continue // libcuda.so.1 matches libcuda.so*; libcudart does not
				}
				src, ok := regularIn(root, m)
				if !ok {
					continue
				}
				out = append(out, replicainit.Bind{Source: src, Target: filepath.Join(imageDriverLibDir, name)})
				found = true
			}
			if found {
				break
			}
		}
	}
	for _, tool := range driverTools {
		for _, dir := range driverBinDirs {
			if src, ok := regularIn(root, filepath.Join(root, dir, tool)); ok {
				out = append(out, replicainit.Bind{Source: src, Target: filepath.Join(imageDriverBinDir, tool)})
				break
			}
		}
	}
	return out
}

// regularIn resolves p's links and reports the regular file it names,
// when that is inside root.
func regularIn(root, p string) (string, bool) {
	real, err := filepath.EvalSymlinks(p)
	if err != nil {
		return "", false
	}
	if root != "/" {
		r, err := filepath.EvalSymlinks(root)
		if err != nil || !strings.HasPrefix(real, r+string(filepath.Separator)) {
			return "", false
		}
	}
	fi, err := os.Stat(real)
	if err != nil || !fi.Mode().IsRegular() {
		return "", false
	}
	return real, true
}
