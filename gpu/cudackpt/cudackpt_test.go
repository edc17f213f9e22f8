package cudackpt

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// fakeDriver keeps each process's state as the driver would, records the
// calls made, and fails the calls the test names.
type fakeDriver struct {
	states map[int]State // absent: a process with no CUDA state
	calls  []string
	fail   map[string]error // "Lock 2" → the error Lock(2) returns
}

func (f *fakeDriver) call(name string, pid int) error {
	c := fmt.Sprintf("%s %d", name, pid)
	f.calls = append(f.calls, c)
	return f.fail[c]
}

func (f *fakeDriver) State(pid int) (State, error) {
	if err := f.call("State", pid); err != nil {
		return 0, err
	}
	st, ok := f.states[pid]
	if !ok {
		return 0, &Error{Call: "cuCheckpointProcessGetState", Pid: pid, Code: 3, Name: "CUDA_ERROR_NOT_INITIALIZED"}
	}
	return st, nil
}

func (f *fakeDriver) move(name string, pid int, from, to State) error {
	if err := f.call(name, pid); err != nil {
		return err
	}
	if f.states[pid] != from {
		return &Error{Call: name, Pid: pid, Code: 401, Name: "CUDA_ERROR_ILLEGAL_STATE"}
	}
	f.states[pid] = to
	return nil
}

func (f *fakeDriver) Lock(pid int, _ uint32) error { return f.move("Lock", pid, Running, Locked) }
func (f *fakeDriver) Checkpoint(pid int) error {
	return f.move("Checkpoint", pid, Locked, Checkpointed)
}
func (f *fakeDriver) Restore(pid int) error { return f.move("Restore", pid, Checkpointed, Locked) }
func (f *fakeDriver) Unlock(pid int) error  { return f.move("Unlock", pid, Locked, Running) }

func newFakeDriver(cuda ...int) *fakeDriver {
	f := &fakeDriver{states: map[int]State{}, fail: map[string]error{}}
	for _, pid := range cuda {
		f.states[pid] = Running
	}
	return f
}

func TestParkCheckpointsEveryCUDAProcessAndSkipsTheOthers(t *testing.T) {
	f := newFakeDriver(10, 12)
	res, err := Park(f, []int{10, 11, 12}, []int{10}, 5000)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(res.Checkpointed, []int{10, 12}) || len(res.Skipped) != 1 || res.Skipped[11] == "" {
		t.Errorf("result %+v", res)
	}
	if f.states[10] != Checkpointed || f.states[12] != Checkpointed {
		t.Errorf("states %v", f.states)
	}
	// All are locked before any is checkpointed: none runs CUDA calls
	// against a peer that is half gone.
	want := []string{"State 10", "State 11", "State 12", "Lock 10", "Lock 12", "Checkpoint 10", "Checkpoint 12"}
	if !slices.Equal(f.calls, want) {
		t.Errorf("calls %v, want %v", f.calls, want)
	}

	f.calls = nil
	if err := Restore(f, res.Checkpointed); err != nil {
		t.Fatal(err)
	}
	if f.states[10] != Running || f.states[12] != Running {
		t.Errorf("after Restore: %v", f.states)
	}
	if want := []string{"State 10", "Restore 10", "Unlock 10", "State 12", "Restore 12", "Unlock 12"}; !slices.Equal(f.calls, want) {
		t.Errorf("calls %v, want %v", f.calls, want)
	}
}

func TestParkUndoesWhatItDidWhenAStepFails(t *testing.T) {
	for _, tc := range []struct {
		name, fail string
	}{
		{"a lock times out", "Lock 12"},
		{"a checkpoint fails", "Checkpoint 12"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeDriver(10, 12)
			f.fail[tc.fail] = &Error{Call: "x", Pid: 12, Code: 909, Name: "CUDA_ERROR_TIMEOUT"}
			_, err := Park(f, []int{10, 12}, nil, 5000)
			if err == nil || !strings.Contains(err.Error(), "CUDA_ERROR_TIMEOUT") {
				t.Fatalf("Park = %v, want the failure", err)
			}
			if f.states[10] != Running || f.states[12] != Running {
				t.Errorf("after a failed Park the processes are %v, want both running", f.states)
			}
		})
	}
}

func TestParkRefusesWhatItCannotCheckpointSafely(t *testing.T) {
	t.Run("a GPU process the driver cannot tell about", func(t *testing.T) {
		f := newFakeDriver(10)
		if _, err := Park(f, []int{10, 11}, []int{11}, 0); err == nil || !strings.Contains(err.Error(), "process 11 uses the GPU") {
			t.Errorf("Park = %v", err)
		}
		if f.states[10] != Running {
			t.Errorf("process 10 is %v", f.states[10])
		}
	})
	t.Run("a process not running", func(t *testing.T) {
		f := newFakeDriver(10)
		f.states[10] = Locked
		if _, err := Park(f, []int{10}, nil, 0); err == nil || !strings.Contains(err.Error(), "locked, not running") {
			t.Errorf("Park = %v", err)
		}
	})
	t.Run("a driver that does not support it", func(t *testing.T) {
		f := newFakeDriver()
		f.fail["State 10"] = &Error{Call: "cuCheckpointProcessGetState", Pid: 10, Code: cudaErrorNotSupported, Name: "CUDA_ERROR_NOT_SUPPORTED"}
		_, err := Park(f, []int{10}, nil, 0)
		if !Unsupported(err) {
			t.Errorf("Park = %v, want an unsupported error", err)
		}
	})
}

func TestRestoreUnlocksAProcessLeftLockedAndReportsFailures(t *testing.T) {
	f := newFakeDriver(10, 11, 12)
	f.states[10] = Locked // a restore that got halfway
	f.states[11] = Checkpointed
	f.fail["Restore 11"] = errors.New("CUDA_ERROR_OUT_OF_MEMORY")
	err := Restore(f, []int{10, 11, 12})
	if err == nil || !strings.Contains(err.Error(), "OUT_OF_MEMORY") {
		t.Fatalf("Restore = %v", err)
	}
	if f.states[10] != Running || f.states[12] != Running {
		t.Errorf("states %v", f.states)
	}
}

// On a box without the NVIDIA driver (this one, in CI) Open says so and
// nothing else happens: no crash, no call into a missing library.
func TestOpenWithoutADriverIsUnsupported(t *testing.T) {
	d, err := Open()
	if err == nil {
		t.Skipf("this box has the CUDA checkpoint API (CUDA %s): nothing to show here", d.VersionString())
	}
	if !errors.Is(err, ErrUnsupported) || !Unsupported(err) {
		t.Errorf("Open = %v, want ErrUnsupported", err)
	}
}
