package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// runCLIEnv runs an admin command with extra NAME=value variables, as make
// run and make doctor pass INFERD_REPLICA_USER.
func runCLIEnv(cfgPath string, env []string, args ...string) (string, error) {
	cmd := exec.Command(inferdBin, append([]string{"--config", cfgPath}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("inferd %s: %v: %s", strings.Join(args, " "), err, errOut.String())
	}
	return out.String(), nil
}

// makeRunEnv is the environment make run gives apply, serve and doctor in a
// checkout other users cannot read (scripts/demo-user.sh): models run as
// the caller. (TestTheDemoRunsAsTheREADMERestartsIt has the default.)
func makeRunEnv(t *testing.T) []string {
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return []string{"INFERD_REPLICA_USER=" + u.Username}
}

// TestApplyChecksModelsBeforeStoringThem: with no daemon and with one, a
// manifest whose model cannot start here (no such dir, no such program) is
// refused whole, naming the project and the fix, and a GPU request the box
// cannot meet is applied with a warning.
func TestApplyChecksModelsBeforeStoringThem(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "")
	env := makeRunEnv(t)
	write := func(name, text string) string {
		t.Helper()
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	broken := write("broken.yaml", "projects:\n"+
		echoProject("nodir", "acme", "mk-nodir", "./does-not-exist", marker(), "")+
		strings.Replace(echoProject("nopython", "acme", "mk-nopython", echo, marker(), ""), `"python3"`, `"python4"`, 1))
	gpus := write("gpus.yaml", "projects:\n"+echoProject("biggpu", "acme", "mk-biggpu", echo, marker(), "")+"    gpus: 64\n")
	wantRefusal := []string{
		"these models cannot start on this machine (nothing was applied):",
		"project nodir: dir " + filepath.Join(dir, "does-not-exist") + " does not exist: create it, or fix dir in the manifest",
		"project nopython: command python4 is not on the PATH models get (",
	}
	wantWarning := regexp.MustCompile(`(?m)^warning: project biggpu: gpus: 64 per replica, but this machine has \d+ GPU\(s\): its calls will fail`)

	check := func(t *testing.T) {
		out, err := runCLIEnv(cfg, env, "apply", "-f", broken)
		if err == nil {
			t.Fatalf("a manifest with broken models was applied: %s", out)
		}
		for _, w := range wantRefusal {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("refusal lacks %q:\n%v", w, err)
			}
		}
		out, err = runCLIEnv(cfg, env, "apply", "-f", gpus)
		if err != nil || !wantWarning.MatchString(out) {
			t.Fatalf("apply of a project needing 64 GPUs: %v\n%s", err, out)
		}
		out, err = runCLIEnv(cfg, env, "project", "list")
		if err != nil || strings.Contains(out, "nodir") || strings.Contains(out, "nopython") {
			t.Errorf("after a refused apply the projects are:\n%s (%v)", out, err)
		}
	}
	t.Run("no daemon", check)
	startDaemonWith(t, dir, cfg, inferdBin, env...)
	t.Run("daemon running", check)
}

// TestDoctorChecksAppliedProjects: right after make run's set-up (its
// manifest applied, the model user as make run sets it) doctor passes and
// says each project is fine; a project whose dir has gone since is named
// with what to fix, and fails doctor.
func TestDoctorChecksAppliedProjects(t *testing.T) {
	t.Parallel()
	echoDir(t)
	_, cfg := newDaemonDir(t, "")
	env := makeRunEnv(t)
	if out, err := runCLIEnv(cfg, env, "apply", "-f", "examples/projects.yaml"); err != nil {
		t.Fatalf("make run's apply: %v\n%s", err, out)
	}
	out, err := runCLIEnv(cfg, env, "doctor")
	if err != nil {
		t.Fatalf("doctor after make run's set-up: %v\n%s", err, out)
	}
	if !strings.Contains(out, "ok    project      echo: dir, command and model user ok; CPU") {
		t.Errorf("doctor does not vouch for the echo project:\n%s", out)
	}

	gone := filepath.Join(t.TempDir(), "model")
	if err := os.Mkdir(gone, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(gone, "server.py"), []byte("print('hi')\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := filepath.Join(t.TempDir(), "m.yaml")
	if err := os.WriteFile(manifest, []byte("projects:\n"+echoProject("moved", "demo", "mk-moved", gone, marker(), "")), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := runCLIEnv(cfg, env, "apply", "-f", manifest); err != nil {
		t.Fatalf("apply: %v\n%s", err, out)
	}
	if err := os.RemoveAll(gone); err != nil {
		t.Fatal(err)
	}
	out, err = runCLIEnv(cfg, env, "doctor")
	if err == nil {
		t.Errorf("doctor passed with a broken project:\n%s", out)
	}
	if want := "fail  project      moved: dir " + gone + " does not exist: create it, or fix dir in the manifest"; !strings.Contains(out, want) {
		t.Errorf("doctor does not name the broken project (want %q):\n%s", want, out)
	}
}
