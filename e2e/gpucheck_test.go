package e2e

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"inferd/internal/testenv"
)

// TestGPUCheckScriptDryRun runs scripts/gpu-check.sh, the script that proves
// the GPU path on a real GPU box (issue #34, docs/gpu.md), in its dry run:
// simulated GPUs, the failpoints build's fake checkpointer in place of the
// CUDA driver, and every step that needs a real driver SKIPPED. So the
// script the device box runs once is known to start, drive inferd, park and
// restore a replica, and write its report here first.
func TestGPUCheckScriptDryRun(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3 on PATH: scripts/gpu-check.sh is python")
	}
	out := t.TempDir()
	cmd := exec.Command("scripts/gpu-check.sh", "--dry-run", "--inferd", failpointBinary(t), "--budget", "180")
	cmd.Env = append(os.Environ(), "OUT="+out)
	log, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("gpu-check.sh --dry-run: %v\n%s", err, log)
	}
	report, err := os.ReadFile(filepath.Join(out, "gpu-report.md"))
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"| 1 | Discovery: inferd doctor and /v1/status against nvidia-smi | **PASS** |",
		"| 2 | examples/digits on CUDA through /start/v4 | **SKIPPED** |",
		"| 4 | Energy: the GPU's total-energy counter per call | **SKIPPED** |",
		"| 5 | Parking: checkpoint an idle GPU replica, restore it on a call | **PASS** |",
		"| 6 | A GPU model in an image: its device nodes and the driver's libraries | **PASS** |",
		"PASS: apply imported the image archive",
		"PASS: the next call restored the same process",
		"PASS: another project's whole-GPU replica ran on that GPU while parked",
	} {
		if !strings.Contains(string(report), want) {
			t.Errorf("the report lacks %q:\n%s", want, report)
		}
	}
	if strings.Contains(string(report), "FAIL") {
		t.Errorf("the dry run failed a check:\n%s", report)
	}
	var result struct {
		Items map[string]struct{ Status string } `json:"items"`
	}
	raw, err := os.ReadFile(filepath.Join(out, "gpu-check.json"))
	if err != nil || json.Unmarshal(raw, &result) != nil || len(result.Items) != 6 {
		t.Errorf("gpu-check.json: %v, %s", err, raw)
	}
	if _, err := os.Stat(filepath.Join(out, "inferd.log")); err != nil {
		t.Errorf("the daemon's log was not kept: %v", err)
	}
}
