package local

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
)

func TestProcessGroupNamesTheGroupAProcessIsIn(t *testing.T) {
	if got, ok := ProcessGroup(os.Getpid()); !ok || got != syscall.Getpgrp() {
		t.Errorf("ProcessGroup(self) = %d, %v; want %d, true", got, ok, syscall.Getpgrp())
	}
	// A child leading a group of its own, as a replica does.
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	if got, ok := ProcessGroup(pid); !ok || got != pid {
		t.Errorf("ProcessGroup(child) = %d, %v; want its own pid %d, true", got, ok, pid)
	}
	cmd.Process.Kill()
	cmd.Wait()
	if got, ok := ProcessGroup(pid); ok {
		t.Errorf("ProcessGroup(exited child) = %d, true; want false", got)
	}
}
