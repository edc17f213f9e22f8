package main

import (
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// make build (and run, doctor, example-NAME, which need the binary) links
// inferd only when a source is newer than it: a second make doctor starts
// at once. The binary here is a stand-in whose age the test sets; make -n
// says what make would run without running it.
func TestMakeBuildsInferdOnlyWhenASourceIsNewer(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		testenv.Missing(t, "make")
	}
	bin := filepath.Join(t.TempDir(), "inferd")
	if err := os.WriteFile(bin, []byte("stand-in"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		age    time.Time
		builds bool
	}{
		{"newer than every source", time.Now().Add(time.Hour), false},
		{"older than the sources", time.Unix(0, 0), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if err := os.Chtimes(bin, tc.age, tc.age); err != nil {
				t.Fatal(err)
			}
			out, err := exec.Command("make", "-n", "build", "BIN="+bin).CombinedOutput()
			if err != nil {
				t.Fatalf("make -n build: %v\n%s", err, out)
			}
			if got := strings.Contains(string(out), "go build"); got != tc.builds {
				t.Errorf("make -n build with the binary %s: builds %v, want %v:\n%s", tc.name, got, tc.builds, out)
			}
			// make -q: exit status 0 when the binary is up to date, 1 when it
			// would be built.
			err = exec.Command("make", "-q", bin, "BIN="+bin).Run()
			var exit *exec.ExitError
			if upToDate := err == nil; upToDate == tc.builds || (err != nil && !errors.As(err, &exit)) {
				t.Errorf("make -q %s: %v, want up to date: %v", bin, err, !tc.builds)
			}
		})
	}
}
