package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// TestPotassiumAppEndToEnd runs an unmodified Potassium app (examples/potassium,
// which calls app.serve() and so asks for port 8000) as two replicas at once
// behind inferd: two overlapping calls are served by different replicas, and a
// handler exception reaches the client as an error message. A Potassium app
// serves one call at a time, so apply refuses concurrency above 1 for it.
func TestPotassiumAppEndToEnd(t *testing.T) {
	t.Parallel()
	const python = "/usr/bin/python3" // the one scripts/test-deps.sh gives Flask
	if out, err := exec.Command(python, "-c", "import flask, werkzeug").CombinedOutput(); err != nil {
		testenv.Missing(t, "%s cannot import flask and werkzeug (%v: %s); install python3-flask (scripts/test-deps.sh does)",
			python, err, strings.TrimSpace(string(out)))
	}
	app, _ := filepath.Abs("examples/potassium")
	dir, cfg := newDaemonDir(t, "cpuSlots: 4\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("kali", false)
	mark := marker()
	project := func(extra string) string {
		return fmt.Sprintf(`projects:
  - id: potassium-app
    team: kali
    modelKey: mk-k
    command: [%q, "app.py"]
    dir: %s
    protocol: potassium
    env: {E2E_MARKER: "%s"}
    minReplicas: 2
    maxReplicas: 2
%s`, python, app, mark, extra)
	}

	t.Run("concurrency above 1 is refused", func(t *testing.T) {
		path := filepath.Join(d.dir, "potassium-concurrency.yaml")
		if err := os.WriteFile(path, []byte(project("    concurrency: 2\n")), 0o600); err != nil {
			t.Fatal(err)
		}
		out, err := d.cli("apply", "-f", path)
		if err == nil || !strings.Contains(err.Error(), `model.concurrency: must be 1 for protocol "potassium"`) {
			t.Fatalf("apply with concurrency 2: %v\n%s", err, out)
		}
	})

	d.apply(project(""))
	c := inferenceClient{t: t, base: d.base, key: key}
	// Both replicas must be up before the overlapping calls, or the first
	// replica could serve both, one after the other.
	eventually(t, 60*time.Second, "both potassium replicas ready", func() bool {
		return slices.Equal(d.replicaStates(key, "potassium-app"), []string{"ready", "ready"})
	})

	// Each call holds its replica until both have started: they overlap, so
	// they run on different replicas whatever the timing.
	hold := t.TempDir()
	release := filepath.Join(hold, "release")
	type result struct {
		r   map[string]any
		err error
	}
	results := make([]chan result, 2)
	for i := range results {
		results[i] = make(chan result, 1)
		in, _ := json.Marshal(map[string]any{"hold": map[string]string{
			"started": filepath.Join(hold, fmt.Sprint("started-", i)), "release": release}})
		go func() {
			r, err := c.tryStart("mk-k", string(in), false)
			results[i] <- result{r, err}
		}()
	}
	eventually(t, 60*time.Second, "both calls running at once", func() bool {
		_, err0 := os.Stat(filepath.Join(hold, "started-0"))
		_, err1 := os.Stat(filepath.Join(hold, "started-1"))
		return err0 == nil && err1 == nil
	})
	if err := os.WriteFile(release, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	replicas := make([]string, 2)
	for i := range results {
		res := <-results[i]
		if res.err != nil || res.r["message"] != "success" {
			t.Fatalf("potassium call: %v %v", res.r, res.err)
		}
		replicas[i] = fmt.Sprint(output(t, res.r)["replica"])
	}
	if replicas[0] == replicas[1] {
		t.Fatalf("two overlapping calls should be served by two replicas, both went to %q", replicas[0])
	}

	r := c.start("mk-k", `{"raise": true}`, false)
	if r["message"] != "error: model raised an exception: ValueError: bad prompt" {
		t.Fatalf("exception message: %v", r["message"])
	}
	r = c.start("mk-k", `{"return_dict": true}`, false)
	if r["message"] != "error: model raised an exception: Exception: Potassium Response object not returned" {
		t.Fatalf("a handler returning no Response: %v", r["message"])
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
