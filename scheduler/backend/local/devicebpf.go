package local

import (
	"encoding/binary"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"unsafe"

	"golang.org/x/sys/unix"
)

// cgroup v2 has no devices controller: the kernel asks the BPF programs
// (BPF_PROG_TYPE_CGROUP_DEVICE) attached to a process's cgroup and its
// ancestors instead, and an open is allowed only when every one allows it.
// So on a host without the v1 devices controller, each replica's v2 cgroup
// gets a program that allows exactly its rules (the same lines as v1's
// devices.allow), as runc and systemd do. The program is small enough to
// assemble here, with no BPF library: for each rule, compare the device's
// type, major and minor, and answer 1 (allow) on a match; 0 at the end.
// It needs CAP_BPF or CAP_SYS_ADMIN (the packaged unit has the latter).

// BPF instruction encodings (linux/bpf_common.h, linux/bpf.h).
const (
	bpfLdxMemW  = 0x61 // dst = *(u32 *)(src + off)
	bpfAndK32   = 0x54 // dst &= imm (32-bit)
	bpfJneK     = 0x55 // if dst != imm goto +off
	bpfMov64K   = 0xb7 // dst = imm
	bpfExit     = 0x95
	bpfDevChar  = 2 // BPF_DEVCG_DEV_CHAR
	bpfInsnSize = 8
)

// bpfInsn is one eBPF instruction.
type bpfInsn struct {
	code     uint8
	dst, src uint8
	off      int16
	imm      int32
}

func (i bpfInsn) put(b []byte) {
	b[0] = i.code
	b[1] = i.dst&0xf | i.src<<4
	binary.LittleEndian.PutUint16(b[2:], uint16(i.off))
	binary.LittleEndian.PutUint32(b[4:], uint32(i.imm))
}

// deviceRule is one "c MAJOR:MINOR rwm" line; minor -1 stands for *.
type deviceRule struct {
	major, minor int
}

func parseRule(line string) (deviceRule, error) {
	f := strings.Fields(line)
	if len(f) != 3 || f[0] != "c" {
		return deviceRule{}, fmt.Errorf("device rule %q: not a character device rule", line)
	}
	maj, min, ok := strings.Cut(f[1], ":")
	r := deviceRule{minor: -1}
	var err error
	if r.major, err = strconv.Atoi(maj); err != nil || !ok {
		return deviceRule{}, fmt.Errorf("device rule %q: bad major", line)
	}
	if min != "*" {
		if r.minor, err = strconv.Atoi(min); err != nil {
			return deviceRule{}, fmt.Errorf("device rule %q: bad minor", line)
		}
	}
	return r, nil
}

// deviceProgram assembles the program that allows exactly rules. Its
// context is struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32
// minor}, the device type in access_type's low 16 bits.
func deviceProgram(rules []string) ([]byte, error) {
	prog := []bpfInsn{
		{code: bpfLdxMemW, dst: 2, src: 1, off: 0}, // r2 = access_type
		{code: bpfAndK32, dst: 2, imm: 0xffff},     // r2 = type
		{code: bpfLdxMemW, dst: 4, src: 1, off: 4}, // r4 = major
		{code: bpfLdxMemW, dst: 5, src: 1, off: 8}, // r5 = minor
	}
	for _, line := range rules {
		r, err := parseRule(line)
		if err != nil {
			return nil, err
		}
		// A block ends "r0 = 1; exit"; each test skips the rest of it.
		n := int16(4)
		if r.minor >= 0 {
			n = 5
		}
		prog = append(prog,
			bpfInsn{code: bpfJneK, dst: 2, off: n - 1, imm: bpfDevChar},
			bpfInsn{code: bpfJneK, dst: 4, off: n - 2, imm: int32(r.major)})
		if r.minor >= 0 {
			prog = append(prog, bpfInsn{code: bpfJneK, dst: 5, off: 2, imm: int32(r.minor)})
		}
		prog = append(prog, bpfInsn{code: bpfMov64K, dst: 0, imm: 1}, bpfInsn{code: bpfExit})
	}
	prog = append(prog, bpfInsn{code: bpfMov64K, dst: 0, imm: 0}, bpfInsn{code: bpfExit})
	out := make([]byte, len(prog)*bpfInsnSize)
	for k, i := range prog {
		i.put(out[k*bpfInsnSize:])
	}
	return out, nil
}

// bpfProgLoadAttr is the head of union bpf_attr for BPF_PROG_LOAD.
type bpfProgLoadAttr struct {
	progType    uint32
	insnCnt     uint32
	insns       uint64
	license     uint64
	logLevel    uint32
	logSize     uint32
	logBuf      uint64
	kernVersion uint32
	progFlags   uint32
}

// bpfAttachAttr is union bpf_attr for BPF_PROG_ATTACH.
type bpfAttachAttr struct {
	targetFD     uint32
	attachBPFFD  uint32
	attachType   uint32
	attachFlags  uint32
	replaceBPFFD uint32
}

// loadDeviceProgram loads rules' program and returns its descriptor.
func loadDeviceProgram(rules []string) (int, error) {
	code, err := deviceProgram(rules)
	if err != nil {
		return -1, err
	}
	license := []byte("GPL\x00") // any string; the cgroup helpers need none
	attr := bpfProgLoadAttr{
		progType: unix.BPF_PROG_TYPE_CGROUP_DEVICE,
		insnCnt:  uint32(len(code) / bpfInsnSize),
		insns:    uint64(uintptr(unsafe.Pointer(&code[0]))),
		license:  uint64(uintptr(unsafe.Pointer(&license[0]))),
	}
	fd, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_LOAD, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr))
	runtime.KeepAlive(code) // attr holds them as bare addresses
	runtime.KeepAlive(license)
	if errno != 0 {
		return -1, fmt.Errorf("load BPF device program: %w", errno)
	}
	return int(fd), nil
}

// attachDeviceProgram loads rules' program and attaches it to the v2
// cgroup dir, beside any its ancestors have (BPF_F_ALLOW_MULTI: every one
// must allow an open). The program lives as long as the cgroup.
func attachDeviceProgram(dir string, rules []string) error {
	prog, err := loadDeviceProgram(rules)
	if err != nil {
		return err
	}
	defer unix.Close(prog)
	cg, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open cgroup %s: %w", dir, err)
	}
	defer unix.Close(cg)
	attr := bpfAttachAttr{
		targetFD:    uint32(cg),
		attachBPFFD: uint32(prog),
		attachType:  unix.BPF_CGROUP_DEVICE,
		attachFlags: unix.BPF_F_ALLOW_MULTI,
	}
	if _, _, errno := unix.Syscall(unix.SYS_BPF, unix.BPF_PROG_ATTACH, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr)); errno != 0 {
		return fmt.Errorf("attach BPF device program to %s: %w", dir, errno)
	}
	return nil
}
