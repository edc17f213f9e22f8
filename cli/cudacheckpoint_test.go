package cli

import (
	"encoding/json"
	"strings"
	"testing"

	"inferd/gpu/cudackpt"
)

// On a box without the NVIDIA driver (CI) the helper the daemon parks
// replicas with says so, in the words and JSON the daemon reads, and
// refuses bad arguments as usage errors.
func TestCUDACheckpointWithoutADriverSaysWhy(t *testing.T) {
	if _, err := cudackpt.Open(); err == nil {
		t.Skip("this box has the CUDA checkpoint API")
	}
	r := runCLI(t, nil, "cuda-checkpoint", "check")
	if r.code != 1 || !strings.Contains(r.stderr, "the CUDA checkpoint API is not available") {
		t.Errorf("check: exit %d, stderr %q", r.code, r.stderr)
	}
	r = runCLI(t, nil, "cuda-checkpoint", "park", "--timeout-ms", "100", "--gpu-pids", "1", "1")
	var answer helperFailure
	if err := json.Unmarshal([]byte(r.stdout), &answer); err != nil || r.code != 1 || !answer.Unsupported || answer.Error == "" {
		t.Errorf("park: exit %d, stdout %q (%v)", r.code, r.stdout, err)
	}
	for _, args := range [][]string{
		{"cuda-checkpoint"},
		{"cuda-checkpoint", "park"},
		{"cuda-checkpoint", "park", "x1"},
		{"cuda-checkpoint", "restore", "--gpu-pids", "0", "5"},
		{"cuda-checkpoint", "check", "5"},
		{"cuda-checkpoint", "freeze", "5"},
	} {
		if r := runCLI(t, nil, args...); r.code != 2 {
			t.Errorf("%v: exit %d, stderr %q; want a usage error", args, r.code, r.stderr)
		}
	}
}
