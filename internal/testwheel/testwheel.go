// Package testwheel builds a wheelhouse for tests from a package written
// on the spot, offline, with the system Python's pip (pip wheel
// --no-index --no-build-isolation: setuptools and wheel from Debian's
// python3-setuptools and python3-wheel, nothing from the network).
package testwheel

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"inferd/internal/testenv"
)

// Python is the interpreter the wheels are built with and the tests'
// environments made from.
const Python = "/usr/bin/python3"

// Wheelhouse writes a package name (one module, name.py, whose hello()
// returns greeting) of version 1.0 and builds its wheel into a new
// wheelhouse under dir, which it returns.
func Wheelhouse(t testing.TB, dir, name, greeting string) string {
	t.Helper()
	if err := exec.Command(Python, "-c", "import setuptools, wheel, pip, venv, ensurepip").Run(); err != nil {
		testenv.Missing(t, "%s with setuptools, wheel, pip and venv (python3-setuptools, python3-wheel, python3-pip, python3-venv): %v", Python, err)
	}
	src := filepath.Join(dir, name+"-src")
	files := map[string]string{
		"setup.py":   fmt.Sprintf("from setuptools import setup\nsetup(name=%q, version=\"1.0\", py_modules=[%q])\n", name, name),
		name + ".py": fmt.Sprintf("def hello():\n    return %q\n", greeting),
	}
	if err := os.MkdirAll(src, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, body := range files {
		if err := os.WriteFile(filepath.Join(src, f), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	house := filepath.Join(dir, "wheels")
	cmd := exec.Command(Python, "-m", "pip", "wheel", "--no-index", "--no-build-isolation", "--no-deps", "-w", house, src)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "PIP_DISABLE_PIP_VERSION_CHECK=1", "HOME="+dir)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("pip wheel: %v\n%s", err, out)
	}
	os.RemoveAll(filepath.Join(src, "build"))
	return house
}
