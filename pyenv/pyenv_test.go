package pyenv

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testwheel"
)

// unreachableIndex is a package index nothing answers: a build that needs
// the network fails as on an offline box.
const unreachableIndex = "http://127.0.0.1:9/simple"

func writeFile(t *testing.T, p, body string) string {
	t.Helper()
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestEnsureBuildsOfflineFromTheWheelhouseOnce: an environment builds from
// a wheelhouse with no index reachable, its package imports, and a second
// project with the same requirements (another file, the same bytes) gets
// the same environment without a build.
func TestEnsureBuildsOfflineFromTheWheelhouseOnce(t *testing.T) {
	dir := t.TempDir()
	house := testwheel.Wheelhouse(t, dir, "greet", "hello from the wheel")
	b, err := New(filepath.Join(dir, "envs"), unreachableIndex)
	if err != nil {
		t.Fatal(err)
	}
	spec := Spec{Requirements: writeFile(t, filepath.Join(dir, "a.txt"), "greet==1.0\n"), Wheelhouse: house, Interpreter: testwheel.Python}
	var log bytes.Buffer
	builds := 0
	env, err := b.Ensure(context.Background(), spec, &log, func() { builds++ })
	if err != nil {
		t.Fatalf("%v\n%s", err, log.String())
	}
	out, err := exec.Command(filepath.Join(env.Bin(), "python"), "-c", "import greet; print(greet.hello())").CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "hello from the wheel" {
		t.Errorf("the environment's python says %q, %v", out, err)
	}
	if !strings.Contains(log.String(), "Successfully installed greet-1.0") {
		t.Errorf("the build's output lacks pip's:\n%s", log.String())
	}
	other := spec
	other.Requirements = writeFile(t, filepath.Join(dir, "b.txt"), "greet==1.0\n")
	again, err := b.Ensure(context.Background(), other, &log, func() { builds++ })
	if err != nil || again.Dir != env.Dir || builds != 1 {
		t.Errorf("the same requirements again: %s, %v, %d builds; want %s and one build", again.Dir, err, builds, env.Dir)
	}
	changed := spec
	changed.Requirements = writeFile(t, filepath.Join(dir, "c.txt"), "greet>=1.0\n") // as long as the first
	if k1, _ := b.Key(spec); k1 == mustKey(t, b, changed) {
		t.Errorf("other requirements have the same key %s", k1)
	}
}

func mustKey(t *testing.T, b *Builder, s Spec) string {
	t.Helper()
	k, err := b.Key(s)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// TestBuildFailuresSayWhyAndLeaveNothing: a wheel the wheelhouse lacks, or
// requirements that need the network on an offline box, fail with pip's
// own last lines, and leave no environment behind.
func TestBuildFailuresSayWhyAndLeaveNothing(t *testing.T) {
	dir := t.TempDir()
	house := testwheel.Wheelhouse(t, dir, "greet", "hi")
	for _, tc := range []struct {
		name  string
		reqs  string
		house string
		want  string
	}{
		{"a wheel the wheelhouse lacks", "greet==1.0\nabsent-package==2.0\n", house, "No matching distribution found for absent-package==2.0"},
		{"the network on an offline box", "greet==1.0\n", "", "No matching distribution found for greet==1.0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := New(filepath.Join(t.TempDir(), "envs"), unreachableIndex)
			if err != nil {
				t.Fatal(err)
			}
			spec := Spec{Requirements: writeFile(t, filepath.Join(t.TempDir(), "requirements.txt"), tc.reqs), Wheelhouse: tc.house, Interpreter: testwheel.Python}
			var log bytes.Buffer
			_, err = b.Ensure(context.Background(), spec, &log, nil)
			var be *BuildError
			if !errors.As(err, &be) || be.Step != "pip install" || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v; want pip's %q\nlog:\n%s", err, tc.want, log.String())
			}
			ents, _ := os.ReadDir(b.dir)
			for _, e := range ents {
				if !strings.HasSuffix(e.Name(), ".lock") {
					t.Errorf("a failed build left %s", e.Name())
				}
			}
		})
	}
}

// TestABuildThatHangsIsStoppedAndLeavesNothing: a build past its time (an
// interpreter that never returns) is killed, says so, and leaves nothing.
func TestABuildThatHangsIsStoppedAndLeavesNothing(t *testing.T) {
	dir := t.TempDir()
	hang := writeFile(t, filepath.Join(dir, "python3"), "#!/bin/sh\nexec sleep 1000\n")
	os.Chmod(hang, 0o755)
	b, err := New(filepath.Join(dir, "envs"), unreachableIndex)
	if err != nil {
		t.Fatal(err)
	}
	b.timeout = 200 * time.Millisecond
	spec := Spec{Requirements: writeFile(t, filepath.Join(dir, "requirements.txt"), "greet\n"), Interpreter: hang}
	_, err = b.Ensure(context.Background(), spec, &bytes.Buffer{}, nil)
	var be *BuildError
	if !errors.As(err, &be) || be.Step != "venv" || !strings.Contains(err.Error(), "the build was stopped after 200ms") {
		t.Fatalf("got %v; want the venv step stopped after 200ms", err)
	}
	if _, ok, _ := b.Ready(spec); ok {
		t.Error("a stopped build is ready")
	}
	env, _, _ := b.Ready(spec)
	if _, err := os.Stat(env.Dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("a stopped build left %s: %v", env.Dir, err)
	}
}
