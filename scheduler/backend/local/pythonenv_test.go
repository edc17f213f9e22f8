package local

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"inferd/internal/testwheel"
	"inferd/scheduler/backend"
	"inferd/store"
)

// pythonScript prints what the model sees of its environment, then stays.
const pythonScript = `import greet, os, sys, time
print("hello=" + greet.hello())
print("prefix=" + sys.prefix)
print("venv=" + os.environ.get("VIRTUAL_ENV", ""))
print("data=" + ",".join(sorted(os.listdir(os.environ["DATA_DIR"]))))
print("done", flush=True)
time.sleep(1000)
`

// TestPythonProjectRunsInItsOwnEnvironmentSharedByItsTwin: a project with
// python: runs `python3` from a venv built offline from its wheelhouse
// (the build's output in its log, its phase told), sees of the data dir
// only its environment, and a second project with the same requirements
// runs from the same venv without a build.
func TestPythonProjectRunsInItsOwnEnvironmentSharedByItsTwin(t *testing.T) {
	work := t.TempDir()
	house := testwheel.Wheelhouse(t, work, "greet", "hello-from-the-wheel")
	data := filepath.Join(t.TempDir(), "data")
	b := testBackendWith(t, func(c *Config) {
		c.PythonDir, c.PythonIndex = filepath.Join(data, "python"), "http://127.0.0.1:9/simple"
	})
	if err := os.WriteFile(filepath.Join(data, "inferd.db"), []byte("secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var phases []string
	for i, project := range []string{"py-a", "py-b"} {
		reqs := filepath.Join(work, project+".txt")
		if err := os.WriteFile(reqs, []byte("greet==1.0\n"), 0o644); err != nil {
			t.Fatal(err)
		}
		spec := backend.Spec{ReplicaID: project + "-1", ProjectID: project, TeamID: "team",
			Model: store.ModelSpec{Command: []string{"python3", "-c", pythonScript}, Env: map[string]string{"DATA_DIR": data},
				Python: store.PythonSpec{Requirements: reqs, Wheelhouse: house, Interpreter: testwheel.Python}},
			Phase: func(ph string) { mu.Lock(); phases = append(phases, ph); mu.Unlock() }}
		p := startModel(t, b, spec)
		out := waitLog(t, b, p, "done")
		venv := field(out, "venv")
		if field(out, "hello") != "hello-from-the-wheel" || field(out, "prefix") != venv || !strings.HasPrefix(venv, filepath.Join(data, "python")+"/") {
			t.Errorf("%s printed:\n%s\nwant the wheel's greeting from a venv under %s", project, out, data)
		}
		built := strings.Contains(out, "inferd: building the python environment")
		if built != (i == 0) {
			t.Errorf("%s: built its environment %v, want %v (the second shares the first's)", project, built, i == 0)
		}
		if b.sb.nsErr == nil && field(out, "data") != "python" {
			t.Errorf("%s sees %q in the data dir, want only its environments' dir", project, field(out, "data"))
		}
	}
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(phases, ",") != backend.PhaseBuildingEnvironment+"," {
		t.Errorf("phases %q, want one build, then its end", phases)
	}
}

// TestPythonBuildFailureFailsTheLaunchWithPipsWords: a requirement the
// wheelhouse lacks fails the launch with pip's last lines.
func TestPythonBuildFailureFailsTheLaunchWithPipsWords(t *testing.T) {
	work := t.TempDir()
	house := testwheel.Wheelhouse(t, work, "greet", "hi")
	b := testBackendWith(t, func(c *Config) { c.PythonDir = filepath.Join(t.TempDir(), "data", "python") })
	reqs := filepath.Join(work, "requirements.txt")
	os.WriteFile(reqs, []byte("greet==1.0\ntorch==9.9\n"), 0o644)
	spec := backend.Spec{ReplicaID: "py-fail-1", ProjectID: "py-fail", TeamID: "team",
		Model: store.ModelSpec{Command: []string{"python3", "-c", "print(1)"}, Python: store.PythonSpec{Requirements: reqs, Wheelhouse: house, Interpreter: testwheel.Python}}}
	_, err := b.start(spec)
	if err == nil || !strings.Contains(err.Error(), "No matching distribution found for torch==9.9") {
		t.Errorf("got %v, want pip's words about torch", err)
	}
}

func TestClosedAncestorIsTheOutermostDirOthersCannotPass(t *testing.T) {
	root := t.TempDir()
	for _, d := range []string{root, filepath.Dir(root)} {
		os.Chmod(d, 0o755) // t.TempDir makes both 0700
	}
	open := filepath.Join(root, "open")
	closed := filepath.Join(open, "closed")
	inner := filepath.Join(closed, "inner", "data")
	for _, d := range []string{inner} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(closed, 0o700)
	os.Chmod(inner, 0o700)
	if outer := closedAncestor(root); outer != "" {
		t.Fatalf("closedAncestor(%s) = %q: the temp dir's parents are closed", root, outer)
	}
	if got := closedAncestor(inner); got != closed {
		t.Errorf("closedAncestor(%s) = %q, want %s", inner, got, closed)
	}
	if got := closedAncestor(open); got != "" {
		t.Errorf("closedAncestor(%s) = %q, want none", open, got)
	}
}

// TestAnUnwantedReplicasBuildGivesUp: once the launch's Cancel is closed
// (the replica stopped while it builds), the build is killed and the
// launch fails saying so.
func TestAnUnwantedReplicasBuildGivesUp(t *testing.T) {
	dir := t.TempDir()
	hang := filepath.Join(dir, "python3")
	if err := os.WriteFile(hang, []byte("#!/bin/sh\nexec sleep 1000\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	reqs := filepath.Join(dir, "requirements.txt")
	os.WriteFile(reqs, []byte("greet\n"), 0o644)
	b := testBackendWith(t, func(c *Config) { c.PythonDir = filepath.Join(dir, "data", "python") })
	cancel := make(chan struct{})
	spec := backend.Spec{ReplicaID: "py-cancel-1", ProjectID: "py-cancel", TeamID: "team", Cancel: cancel,
		Model: store.ModelSpec{Command: []string{"python3", "-c", "1"}, Python: store.PythonSpec{Requirements: reqs, Interpreter: hang}},
		Phase: func(ph string) {
			if ph == backend.PhaseBuildingEnvironment {
				close(cancel) // the project is deleted as the build begins
			}
		}}
	_, err := b.start(spec)
	if err == nil || !strings.Contains(err.Error(), "the build was cancelled") {
		t.Errorf("got %v, want the cancelled build", err)
	}
}
