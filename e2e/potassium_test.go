package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestPotassiumAppEndToEnd runs an unmodified Potassium app (examples/potassium,
// which calls app.serve() and so asks for port 8000) as two replicas at once
// behind inferd: two overlapping calls are served by different replicas, and a
// handler exception reaches the client as an error message.
func TestPotassiumAppEndToEnd(t *testing.T) {
	if err := exec.Command("python3", "-c", "import flask, werkzeug").Run(); err != nil {
		t.Skip("python3 with Flask is needed for the Potassium test double")
	}
	app, _ := filepath.Abs("examples/potassium")
	dir, cfg := newDaemonDir(t, "cpuSlots: 4\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("kali", false)
	mark := marker()
	d.apply(fmt.Sprintf(`projects:
  - id: potassium-app
    team: kali
    modelKey: mk-k
    command: ["python3", "app.py"]
    dir: %s
    protocol: potassium
    env: {E2E_MARKER: "%s"}
    minReplicas: 2
    maxReplicas: 2
`, app, mark))
	c := inferenceClient{t: t, base: d.base, key: key}
	// Both replicas must be up before the overlapping calls, or on a slow box
	// the first replica can serve both before the second is ready.
	eventually(t, 60*time.Second, "both potassium replicas ready", func() bool {
		return slices.Equal(d.replicaStates(key, "potassium-app"), []string{"ready", "ready"})
	})

	var wg sync.WaitGroup
	replicas := make([]string, 2)
	for i := range replicas {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := c.start("mk-k", `{"sleep": 1.5}`, false)
			if r["message"] != "success" {
				t.Errorf("potassium call: %v", r)
				return
			}
			replicas[i] = fmt.Sprint(output(t, r)["replica"])
		}()
	}
	wg.Wait()
	if replicas[0] == replicas[1] {
		t.Fatalf("two overlapping calls should be served by two replicas, both went to %q", replicas[0])
	}

	r := c.start("mk-k", `{"raise": true}`, false)
	if r["message"] != "error: model raised an exception: ValueError: bad prompt" {
		t.Fatalf("exception message: %v", r["message"])
	}
	if r := c.start("mk-k", `{"after": "exception"}`, false); r["message"] != "success" {
		t.Fatalf("the app keeps serving after an exception: %v", r)
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "data", "logs", "kali", "potassium-app", "*.log"))
	var all strings.Builder
	for _, l := range logs {
		b, _ := os.ReadFile(l)
		all.Write(b)
	}
	if !strings.Contains(all.String(), "Traceback") {
		t.Fatalf("the full traceback should be in the replica log")
	}
}
