package replicainit

import (
	"errors"
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// No user namespaces for models unless the project allows them
// (allowUserNamespaces): a user namespace hands its creator every
// capability inside it, which turns kernel bugs reachable only with
// CAP_SYS_ADMIN or CAP_NET_ADMIN into ones any model can reach, and it is
// not something a model server needs. Linux has no per-process switch for
// it (user.max_user_namespaces is one count for the whole box), so, as
// container runtimes do, a seccomp filter refuses it: clone and unshare
// with CLONE_NEWUSER fail with EPERM, and clone3, whose flags sit in
// memory a filter cannot read, fails with ENOSYS, which makes glibc and
// Go fall back to clone. The replica's init (replicainit.go) installs it on
// the thread that then starts the model, so the model and everything it
// starts inherit it; no_new_privs, which the box sets, lets an
// unprivileged process install one.
//
// The program is classic BPF, assembled here (as devicebpf.go assembles
// its eBPF): a dozen instructions are not worth a dependency. It checks
// the calling ABI first, since a 64-bit kernel also takes 32-bit system
// calls (int 0x80 on x86-64, AArch32 on arm64) under other numbers, and
// x86-64's x32 calls carry bit 30 in the number.

// seccomp_data offsets (linux/seccomp.h): the call's number, its ABI and
// the low 32 bits of its first argument (little-endian machines).
const (
	seccompNr     = 0
	seccompArch   = 4
	seccompArg0   = 16
	x32SyscallBit = 0x40000000

	bpfLdWAbs = unix.BPF_LD | unix.BPF_W | unix.BPF_ABS
	bpfJeqK   = unix.BPF_JMP | unix.BPF_JEQ | unix.BPF_K
	bpfJsetK  = unix.BPF_JMP | unix.BPF_JSET | unix.BPF_K
	bpfAndK   = unix.BPF_ALU | unix.BPF_AND | unix.BPF_K
	bpfRetK   = unix.BPF_RET | unix.BPF_K
)

// seccompABI is one system call ABI a kernel takes, with its numbers for
// the calls that make namespaces.
type seccompABI struct {
	arch                   uint32
	clone, unshare, clone3 uint32
	x32                    bool // numbers may carry x32SyscallBit
}

// seccompABIs are the ABIs of the kernels inferd is built for, by GOARCH:
// the native one and the 32-bit one the same kernel takes.
var seccompABIs = map[string][]seccompABI{
	"amd64": {
		{arch: unix.AUDIT_ARCH_X86_64, clone: 56, unshare: 272, clone3: 435, x32: true},
		{arch: unix.AUDIT_ARCH_I386, clone: 120, unshare: 310, clone3: 435},
	},
	"arm64": {
		{arch: unix.AUDIT_ARCH_AARCH64, clone: 220, unshare: 97, clone3: 435},
		{arch: unix.AUDIT_ARCH_ARM, clone: 120, unshare: 337, clone3: 435},
	},
}

// errNoSeccompABI is a GOARCH the filter has no system call numbers for.
var errNoSeccompABI = fmt.Errorf("no seccomp filter for %s yet", runtime.GOARCH)

// userNamespaceFilter assembles the filter for abis: per ABI, a block that
// answers clone3 ENOSYS, clone and unshare with CLONE_NEWUSER EPERM, and
// allows the rest; a call of any other ABI is refused whole.
func userNamespaceFilter(abis []seccompABI) []unix.SockFilter {
	const (
		allow  = unix.SECCOMP_RET_ALLOW
		eperm  = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		enosys = unix.SECCOMP_RET_ERRNO | uint32(unix.ENOSYS)
	)
	stmt := func(code uint16, k uint32) unix.SockFilter { return unix.SockFilter{Code: code, K: k} }
	jump := func(code uint16, k uint32, jt, jf uint8) unix.SockFilter {
		return unix.SockFilter{Code: code, K: k, Jt: jt, Jf: jf}
	}
	var prog []unix.SockFilter
	for _, a := range abis {
		var block []unix.SockFilter
		block = append(block, stmt(bpfLdWAbs, seccompNr))
		if a.x32 {
			block = append(block, stmt(bpfAndK, ^uint32(x32SyscallBit)))
		}
		block = append(block,
			jump(bpfJeqK, a.clone3, 0, 1), // clone3: its flags cannot be read here
			stmt(bpfRetK, enosys),
			jump(bpfJeqK, a.clone, 1, 0),
			jump(bpfJeqK, a.unshare, 0, 3),
			stmt(bpfLdWAbs, seccompArg0), // clone's and unshare's flags
			jump(bpfJsetK, unix.CLONE_NEWUSER, 0, 1),
			stmt(bpfRetK, eperm),
			stmt(bpfRetK, allow),
		)
		// Load the ABI, and skip this block unless it is a's.
		prog = append(prog, stmt(bpfLdWAbs, seccompArch), jump(bpfJeqK, a.arch, 0, uint8(len(block))))
		prog = append(prog, block...)
	}
	return append(prog, stmt(bpfRetK, eperm))
}

// denyUserNamespaces installs the filter on the calling thread, which must
// be locked to it (children it forks inherit the filter, the process's
// other threads do not) and have no_new_privs set or CAP_SYS_ADMIN.
func denyUserNamespaces() error {
	abis, ok := seccompABIs[runtime.GOARCH]
	if !ok {
		return errNoSeccompABI
	}
	filter := userNamespaceFilter(abis)
	prog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	if err := unix.Prctl(unix.PR_SET_SECCOMP, unix.SECCOMP_MODE_FILTER, uintptr(unsafe.Pointer(&prog)), 0, 0); err != nil {
		if errors.Is(err, unix.EINVAL) {
			return fmt.Errorf("install seccomp filter: the kernel has no seccomp filters (CONFIG_SECCOMP_FILTER): %w", err)
		}
		return fmt.Errorf("install seccomp filter: %w", err)
	}
	return nil
}
