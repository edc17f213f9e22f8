//go:build cgo

package cudackpt

/*
#cgo LDFLAGS: -ldl
#include <dlfcn.h>
#include <stdlib.h>

// The few types of cuda.h that these calls use, so that no CUDA headers are
// needed to build: CUresult and CUprocessState are C enums (int).
typedef struct {
	unsigned int timeoutMs;
	unsigned int reserved0;
	unsigned long long reserved1[7];
} ckptLockArgs; // CUcheckpointLockArgs

typedef int (*fnInit)(unsigned int);
typedef int (*fnVersion)(int *);
typedef int (*fnErrorName)(int, const char **);
typedef int (*fnState)(int, int *);
typedef int (*fnLock)(int, ckptLockArgs *);
typedef int (*fnPid)(int, void *); // Checkpoint, Restore, Unlock: args may be NULL

static void *ckptOpen(void) { return dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL); }
static const char *ckptDlerror(void) { return dlerror(); }
static void *ckptSym(void *h, const char *name) { return dlsym(h, name); }

static int ckptInit(void *f) { return ((fnInit)f)(0); }
static int ckptVersion(void *f, int *v) { return ((fnVersion)f)(v); }
static const char *ckptErrorName(void *f, int code) {
	const char *s = NULL;
	if (f == NULL || ((fnErrorName)f)(code, &s) != 0) return NULL;
	return s;
}
static int ckptState(void *f, int pid, int *st) { return ((fnState)f)(pid, st); }
static int ckptLock(void *f, int pid, unsigned int timeoutMs) {
	ckptLockArgs a = {0};
	a.timeoutMs = timeoutMs;
	return ((fnLock)f)(pid, &a);
}
static int ckptPid(void *f, int pid) { return ((fnPid)f)(pid, NULL); }
*/
import "C"

import (
	"fmt"
	"unsafe"
)

// Driver is the CUDA driver's checkpoint API, from libcuda.so.1.
type Driver struct {
	version                                  int
	errorName                                unsafe.Pointer
	state, lock, checkpoint, restore, unlock unsafe.Pointer
}

// The entry points Open needs; the checkpoint ones came with driver 570.
var (
	symInit       = "cuInit"
	symVersion    = "cuDriverGetVersion"
	symErrorName  = "cuGetErrorName"
	checkpointAPI = []string{"cuCheckpointProcessGetState", "cuCheckpointProcessLock",
		"cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock"}
)

// Open loads the driver's library and initialises it. Its error wraps
// ErrUnsupported when there is no driver, or one without the checkpoint API
// (it names the driver's CUDA version then). The library stays loaded for
// the life of the process, as the driver expects.
func Open() (*Driver, error) {
	h := C.ckptOpen()
	if h == nil {
		return nil, fmt.Errorf("%w: no NVIDIA driver library (dlopen libcuda.so.1: %s)", ErrUnsupported, C.GoString(C.ckptDlerror()))
	}
	sym := func(name string) unsafe.Pointer {
		cs := C.CString(name)
		defer C.free(unsafe.Pointer(cs))
		return C.ckptSym(h, cs)
	}
	d := &Driver{errorName: sym(symErrorName)}
	initF, versionF := sym(symInit), sym(symVersion)
	if initF == nil || versionF == nil {
		return nil, fmt.Errorf("%w: libcuda.so.1 has no %s", ErrUnsupported, symInit)
	}
	if r := C.ckptInit(initF); r != 0 {
		return nil, fmt.Errorf("%w: %v", ErrUnsupported, d.err("cuInit", 0, r))
	}
	var v C.int
	if r := C.ckptVersion(versionF, &v); r != 0 {
		return nil, d.err(symVersion, 0, r)
	}
	d.version = int(v)
	ptrs := []*unsafe.Pointer{&d.state, &d.lock, &d.checkpoint, &d.restore, &d.unlock}
	for i, name := range checkpointAPI {
		if *ptrs[i] = sym(name); *ptrs[i] == nil {
			return nil, fmt.Errorf("%w: the NVIDIA driver (CUDA %s) has no %s: driver 570 or later is needed", ErrUnsupported, versionString(d.version), name)
		}
	}
	return d, nil
}

// Version is the driver's CUDA version, as cuDriverGetVersion gives it
// (12080 for 12.8).
func (d *Driver) Version() int { return d.version }

// VersionString is Version as "12.8".
func (d *Driver) VersionString() string { return versionString(d.version) }

func versionString(v int) string { return fmt.Sprintf("%d.%d", v/1000, v%1000/10) }

// State reads pid's checkpoint state.
func (d *Driver) State(pid int) (State, error) {
	var st C.int
	if r := C.ckptState(d.state, C.int(pid), &st); r != 0 {
		return 0, d.err("cuCheckpointProcessGetState", pid, r)
	}
	return State(st), nil
}

// Lock blocks pid's CUDA calls, waiting up to timeoutMs (0: no limit) for
// those in flight.
func (d *Driver) Lock(pid int, timeoutMs uint32) error {
	if r := C.ckptLock(d.lock, C.int(pid), C.uint(timeoutMs)); r != 0 {
		return d.err("cuCheckpointProcessLock", pid, r)
	}
	return nil
}

// Checkpoint moves locked pid's GPU memory into its host memory and
// releases the GPU.
func (d *Driver) Checkpoint(pid int) error {
	return d.pidCall("cuCheckpointProcessCheckpoint", d.checkpoint, pid)
}

// Restore brings checkpointed pid's GPU state back; it stays locked.
func (d *Driver) Restore(pid int) error {
	return d.pidCall("cuCheckpointProcessRestore", d.restore, pid)
}

// Unlock lets locked pid's CUDA calls run again.
func (d *Driver) Unlock(pid int) error {
	return d.pidCall("cuCheckpointProcessUnlock", d.unlock, pid)
}

func (d *Driver) pidCall(name string, f unsafe.Pointer, pid int) error {
	if r := C.ckptPid(f, C.int(pid)); r != 0 {
		return d.err(name, pid, r)
	}
	return nil
}

// err words a failed call's CUresult.
func (d *Driver) err(call string, pid int, r C.int) error {
	name := "CUDA error"
	if s := C.ckptErrorName(d.errorName, r); s != nil {
		name = C.GoString(s)
	}
	return &Error{Call: call, Pid: pid, Code: int(r), Name: name}
}
