package replicainit

import (
	"encoding/binary"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

// runFilter runs a classic BPF seccomp program on one system call, as the
// kernel would: the instructions the filter uses, nothing more.
func runFilter(t *testing.T, prog []unix.SockFilter, arch, nr uint32, arg0 uint64) uint32 {
	t.Helper()
	var data [64]byte
	binary.LittleEndian.PutUint32(data[seccompNr:], nr)
	binary.LittleEndian.PutUint32(data[seccompArch:], arch)
	binary.LittleEndian.PutUint64(data[seccompArg0:], arg0)
	var acc uint32
	for pc := 0; pc < len(prog); pc++ {
		in := prog[pc]
		switch in.Code {
		case bpfLdWAbs:
			acc = binary.LittleEndian.Uint32(data[in.K:])
		case bpfAndK:
			acc &= in.K
		case bpfJeqK, bpfJsetK:
			hit := acc == in.K
			if in.Code == bpfJsetK {
				hit = acc&in.K != 0
			}
			if hit {
				pc += int(in.Jt)
			} else {
				pc += int(in.Jf)
			}
		case bpfRetK:
			return in.K
		default:
			t.Fatalf("instruction %d: code %#x the filter should not use", pc, in.Code)
		}
	}
	t.Fatal("the filter ran off its end")
	return 0
}

// TestUserNamespaceFilterAnswersEachABI runs the filter on the calls that
// make namespaces, in every ABI a 64-bit kernel takes: user namespaces are
// refused (EPERM; clone3, whose flags it cannot read, ENOSYS), everything
// else passes, and an ABI it does not know is refused whole.
func TestUserNamespaceFilterAnswersEachABI(t *testing.T) {
	const (
		allow  = unix.SECCOMP_RET_ALLOW
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	)
	for goarch, abis := range seccompABIs {
		prog := userNamespaceFilter(abis)
		for _, a := range abis {
			for _, tc := range []struct {
				name string
				nr   uint32
				arg0 uint64
				want uint32
			}{
				{"clone with CLONE_NEWUSER", a.clone, unix.CLONE_NEWUSER | uint64(unix.SIGCHLD), eperm},
				{"clone (fork)", a.clone, uint64(unix.SIGCHLD), allow},
				{"clone of a thread", a.clone, unix.CLONE_VM | unix.CLONE_THREAD | unix.CLONE_SIGHAND, allow},
				{"unshare CLONE_NEWUSER", a.unshare, unix.CLONE_NEWUSER, eperm},
				{"unshare CLONE_NEWUSER with others", a.unshare, unix.CLONE_NEWUSER | unix.CLONE_NEWNS, eperm},
				{"unshare CLONE_NEWNS", a.unshare, unix.CLONE_NEWNS, allow},
				{"clone3", a.clone3, 0, enosys},
				{"another call", 1, unix.CLONE_NEWUSER, allow},
			} {
				if got := runFilter(t, prog, a.arch, tc.nr, tc.arg0); got != tc.want {
					t.Errorf("%s, ABI %#x: %s = %#x, want %#x", goarch, a.arch, tc.name, got, tc.want)
				}
				if a.x32 {
					if got := runFilter(t, prog, a.arch, tc.nr|x32SyscallBit, tc.arg0); got != tc.want {
						t.Errorf("%s, x32: %s = %#x, want %#x", goarch, tc.name, got, tc.want)
					}
				}
			}
		}
		if got := runFilter(t, prog, unix.AUDIT_ARCH_PPC64LE, 1, 0); got != eperm {
			t.Errorf("%s: a call of an unknown ABI = %#x, want EPERM", goarch, got)
		}
	}
	if _, ok := seccompABIs[runtime.GOARCH]; !ok {
		t.Logf("no filter for %s: the userNamespaces protection is off there", runtime.GOARCH)
	}
}
