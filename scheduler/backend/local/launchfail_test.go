package local

import (
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	"inferd/internal/testenv"
)

// A launch that fails (a program that does not exist) leaves no cgroup
// behind and logs no warning: the thread that tried to fork the model
// leaves the replica's cgroups before they are removed.
func TestFailedLaunchLeavesNoCgroupAndNoWarning(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	var logged syncBuffer // logread_test.go
	b, err := New(Config{LogDir: filepath.Join(dir, "logs"), RunDir: filepath.Join(dir, "run"), User: "root"},
		zerolog.New(&logged).Level(zerolog.WarnLevel))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	if b.sb.cgroups == nil {
		testenv.Missing(t, "a cgroup per replica: %s", b.sb.cgWhy)
	}
	before := len(logged.String()) // New's own line on the sandbox
	bases := []string{b.sb.cgroups.v2}
	for _, v1 := range b.sb.cgroups.v1 {
		bases = append(bases, v1.base)
	}
	// Without the fix the forking thread's exit races the removal, and
	// loses one time in ten or so: try often enough to see it.
	for i := range 50 {
		spec := sandboxSpec(fmt.Sprintf("fail-%d", i), "")
		spec.Model.Command = []string{filepath.Join(dir, "no-such-program")}
		if _, err := b.Launch(spec); err == nil {
			t.Fatal("a launch of a missing program succeeded")
		}
		for _, base := range bases {
			if base == "" {
				continue
			}
			if _, err := os.Stat(filepath.Join(base, spec.ReplicaID)); !os.IsNotExist(err) {
				t.Errorf("cgroup %s left by the failed launch (stat: %v)", filepath.Join(base, spec.ReplicaID), err)
				syscall.Rmdir(filepath.Join(base, spec.ReplicaID)) // empty by now: leave the host clean
			}
		}
	}
	if w := logged.String()[before:]; w != "" {
		t.Errorf("the failed launch logged warnings:\n%s", w)
	}
}
