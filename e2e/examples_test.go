package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"inferd/internal/testenv"
)

// Every example applies and answers as its README says, through the
// command its README names (make example-NAME runs scripts/example.sh NAME)
// against a daemon that runs its models as an installed service does: as
// root, under a uid of each project's own, which may not reach a python3
// under /root (the examples run /usr/bin/python3). The npm clients' examples
// run where make client-deps installed them (make test).
func TestExamplesAnswerAsTheirREADMEsSay(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/usr/bin/python3"); err != nil {
		testenv.Missing(t, "/usr/bin/python3: the examples run on it")
	}
	if _, err := exec.LookPath("curl"); err != nil {
		testenv.Missing(t, "curl: scripts/example.sh calls with it, as the READMEs do")
	}
	// Room for each example's replica beside the others'.
	dir, cfg := newDaemonDir(t, "cpuSlots: 8\n")
	d := startDaemonEnv(t, dir, cfg)
	for _, tc := range []struct {
		name  string
		needs string // an npm client's example: its node_modules
	}{
		{"echo", ""},
		{"batch", ""},
		{"stream", ""},
		{"potassium", ""},
		{"openai-mock", ""},
		{"digits", ""},
		{"openai-js", "openai"},
		{"banana-js", "banana-v6"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "potassium" || tc.name == "banana-js" {
				if err := exec.Command("/usr/bin/python3", "-c", "import flask, werkzeug").Run(); err != nil {
					testenv.Missing(t, "Debian's python3-flask: the Potassium test double needs it")
				}
			}
			if tc.name == "digits" {
				if err := exec.Command("/usr/bin/python3", "-c", "import torch, sklearn").Run(); err != nil {
					testenv.Missing(t, "Debian's python3-torch and python3-sklearn: examples/digits needs them (make digits-deps)")
				}
			}
			if tc.needs != "" {
				clientTestTools(t)
				if _, err := os.Stat(filepath.Join("examples", tc.name, "node_modules", tc.needs)); err != nil {
					testenv.Missing(t, "examples/%s/node_modules (make client-deps installs it)", tc.name)
				}
			}
			cmd := exec.Command("scripts/example.sh", tc.name)
			cmd.Env = append(os.Environ(), "INFERD="+inferdBin, "CONFIG="+cfg)
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(string(out), "example "+tc.name+": answered as its README says") {
				t.Fatalf("scripts/example.sh %s: %v\n%s\ndaemon log:\n%s", tc.name, err, out, d.logs)
			}
		})
	}
}
