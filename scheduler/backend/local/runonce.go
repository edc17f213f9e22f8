package local

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"syscall"
	"time"

	"inferd/scheduler/backend"
)

// RunOnce runs argv once the way a replica of spec starts: in the model's
// dir, with a replica's environment (ModelEnv, pinned to spec.GPUs) and as
// runAs (nil: inferd's own user), with a scratch HOME removed afterwards. It
// runs outside any sandbox and returns what the command printed; its whole
// process group is killed when ctx ends. doctor uses it to ask a model's
// interpreter what it sees (does torch see CUDA?), so that the process code
// stays in this package.
func RunOnce(ctx context.Context, spec backend.Spec, runAs *RunAs, pass, argv []string) (stdout, stderr []byte, err error) {
	home, err := os.MkdirTemp("", "inferd-run-once-")
	if err != nil {
		return nil, nil, err
	}
	defer os.RemoveAll(home)
	attr := &syscall.SysProcAttr{Setpgid: true}
	if runAs != nil {
		if err := os.Chown(home, int(runAs.UID), int(runAs.GID)); err != nil {
			return nil, nil, err
		}
		attr.Credential = runAs.Credential()
	}
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.Dir = spec.Model.Dir
	cmd.Env = ModelEnv(spec, runAs, home, pass)
	cmd.SysProcAttr = attr
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	cmd.WaitDelay = time.Second
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.Bytes(), errOut.Bytes(), err
}
