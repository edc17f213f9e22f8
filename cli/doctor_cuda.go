package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"inferd/gpu"
	"inferd/scheduler/backend"
	"inferd/scheduler/backend/local"
	"inferd/store"
)

// A GPU project's model only uses its GPU if its Python's torch is a CUDA
// build that sees the GPU, and Debian's python3-torch is neither (CPU-only
// 1.13; UUID pinning needs torch 2.0 or later). The model then quietly runs
// on CPU, so doctor asks that Python itself, the way a replica would run it.

// cudaProbe is what the model's Python runs: torch's version, the CUDA it
// was built with (None for a CPU-only build) and whether CUDA sees the
// pinned GPU, as one marked JSON line.
const cudaProbe = `import json, torch
print("inferd-cuda " + json.dumps({"torch": torch.__version__, "cuda": torch.version.cuda, "available": torch.cuda.is_available()}))
`

// cudaProbeMark starts the probe's answer line.
const cudaProbeMark = "inferd-cuda "

// cudaProbeTimeout bounds the probe: importing torch takes seconds.
const cudaProbeTimeout = 60 * time.Second

// cudaAnswer is the probe's answer.
type cudaAnswer struct {
	Torch     string  `json:"torch"`
	CUDA      *string `json:"cuda"`
	Available bool    `json:"available"`
}

// needsCUDA says whether a project's replicas get a GPU and run a Python
// of the host's, which doctor can ask about CUDA: not a model in an image
// (its Python is the image's) nor one in a Python environment (built only
// at its first boot).
func needsCUDA(m store.ModelSpec) bool {
	return m.GPUDemand().GPUs > 0 && m.Image == "" && !m.Python.On()
}

// modelPython is the interpreter that runs m: its command's program when
// that is a Python, else the value of an env variable named PYTHON or
// ending in _PYTHON (examples/digits' DIGITS_PYTHON, which its shell
// command runs). "" when neither says.
func modelPython(m store.ModelSpec) string {
	if len(m.Command) > 0 && strings.HasPrefix(filepath.Base(m.Command[0]), "python") {
		return m.Command[0]
	}
	var names []string
	for k := range m.Env {
		if k == "PYTHON" || strings.HasSuffix(k, "_PYTHON") {
			names = append(names, k)
		}
	}
	slices.Sort(names)
	for _, k := range names {
		if v := m.Env[k]; v != "" {
			return v
		}
	}
	return ""
}

// cudaCheck runs the CUDA probe with p's Python, as runAs, with the
// environment a replica of p gets (pass is replica.passEnv) and one GPU of
// devs pinned, and says what it found: status ok or warn, and the line.
func cudaCheck(ctx context.Context, p store.Project, devs []gpu.Device, runAs *local.RunAs, pass []string) (string, string) {
	var pin *gpu.Device
	for k := range devs {
		if devs[k].Healthy() {
			pin = &devs[k]
			break
		}
	}
	if pin == nil {
		return "ok", "CUDA check skipped: this box has no usable GPU, so the model's Python could see none"
	}
	py := modelPython(p.Model)
	if py == "" {
		return "warn", fmt.Sprintf("CUDA check skipped: cannot tell which Python runs %q; run python directly, or name it in env as <NAME>_PYTHON (as examples/digits does)", p.Model.Command)
	}
	if !strings.Contains(py, "/") {
		path, err := local.LookPath(py)
		if err != nil {
			return "warn", fmt.Sprintf("CUDA check: %s is not on PATH: %v", py, err)
		}
		py = path
	}
	ans, err := runCUDAProbe(ctx, py, p, pin.UUID, runAs, pass)
	if err != nil {
		return "warn", fmt.Sprintf("%s cannot tell whether it sees CUDA: %v; it needs a CUDA-enabled torch >= 2.0 (docs/gpu.md)", py, err)
	}
	return cudaVerdict(py, ans, *pin)
}

// cudaVerdict turns the probe's answer into doctor's line.
func cudaVerdict(py string, ans cudaAnswer, pin gpu.Device) (string, string) {
	var problems []string
	if ans.CUDA == nil {
		problems = append(problems, "it is a CPU-only build, so the model runs on CPU")
	}
	if major, _, _ := strings.Cut(ans.Torch, "."); major != "" {
		if n, err := strconv.Atoi(major); err == nil && n < 2 {
			problems = append(problems, "it is older than 2.0, which GPU UUIDs in CUDA_VISIBLE_DEVICES need")
		}
	}
	build := "torch " + ans.Torch
	if ans.CUDA != nil {
		build += " (CUDA " + *ans.CUDA + ")"
	}
	switch {
	case ans.Available:
	case pin.Simulated:
		if len(problems) == 0 {
			return "ok", fmt.Sprintf("%s in %s; the GPUs are simulated (gpu.simulate), so CUDA sees none", build, py)
		}
	case ans.CUDA != nil:
		problems = append(problems, "CUDA does not see the pinned GPU "+pin.UUID+": check that nvidia_uvm is loaded and libcuda.so.1 is found (replica.passEnv)")
	}
	if len(problems) > 0 {
		return "warn", fmt.Sprintf("%s in %s: %s; give the model a Python with a CUDA-enabled torch >= 2.0 (docs/gpu.md)", build, py, strings.Join(problems, "; "))
	}
	return "ok", fmt.Sprintf("%s in %s sees its GPU %s", build, py, pin.UUID)
}

// runCUDAProbe runs the probe with py in p's dir, as runAs, with a
// replica's environment pinned to uuid (local.RunOnce), and reads its answer.
func runCUDAProbe(ctx context.Context, py string, p store.Project, uuid string, runAs *local.RunAs, pass []string) (cudaAnswer, error) {
	spec := backend.Spec{ReplicaID: "doctor-cuda", ProjectID: p.ID, TeamID: p.TeamID, Model: p.Model, GPUs: []string{uuid}}
	ctx, cancel := context.WithTimeout(ctx, cudaProbeTimeout)
	defer cancel()
	stdout, stderr, runErr := local.RunOnce(ctx, spec, runAs, pass, []string{py, "-c", cudaProbe})
	for _, line := range strings.Split(string(stdout), "\n") {
		if rest, ok := strings.CutPrefix(line, cudaProbeMark); ok {
			var ans cudaAnswer
			if err := json.Unmarshal([]byte(rest), &ans); err != nil {
				return cudaAnswer{}, fmt.Errorf("unreadable answer %q: %w", rest, err)
			}
			return ans, nil
		}
	}
	if errors.Is(ctx.Err(), context.DeadlineExceeded) {
		return cudaAnswer{}, fmt.Errorf("no answer within %s", cudaProbeTimeout)
	}
	if strings.TrimSpace(string(stderr)) != "" {
		return cudaAnswer{}, errors.New(lastLine(string(stderr))) // "ModuleNotFoundError: No module named 'torch'"
	}
	if runErr != nil {
		return cudaAnswer{}, runErr
	}
	return cudaAnswer{}, errors.New("no answer")
}
