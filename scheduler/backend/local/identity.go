package local

import (
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"

	"inferd/internal/durable"
)

// Identity: who a replica runs as. When inferd may switch users (root, or
// the packaged service's CAP_SETUID and CAP_SETGID), each project's replicas
// run under a uid of their own from replica.uidRange, so that no model can
// read another's /proc/PID/environ, signal it or touch its files (this
// kernel kind has no Yama ptrace restriction: same-uid processes can read
// each other's memory). A uid needs no /etc/passwd entry; its gid is the
// same number and it has no supplementary groups. replica.user: NAME (all
// projects as one user) and root stay as explicit opt-outs.
//
// The assignment is kept in a file (Config.UIDFile) for good: a project
// keeps its uid across restarts, and a uid once given is never given to
// another project, nor to the same id made again for another team, so
// that nothing a deleted project left (a file in /tmp) is reachable by
// whoever comes next.

// DefaultUIDFirst and DefaultUIDLast bound the uids handed out per project
// by default: the range systemd uses for DynamicUser.
const (
	DefaultUIDFirst = 61184
	DefaultUIDLast  = 65519
)

// PerProject is Config.User's value (and "") for a uid per project.
const PerProject = "per-project"

// uidTable hands out one uid per team/project and keeps the assignment.
type uidTable struct {
	first, last uint32
	path        string // "" = kept in memory only
	readOnly    bool   // path is read, never written

	mu       sync.Mutex
	assigned map[string]uint32 // "team/project" → uid
	used     map[uint32]bool
}

// uidFile is the file's format.
type uidFile struct {
	Version  int               `json:"version"`
	Assigned map[string]uint32 `json:"assigned"`
}

// openUIDTable reads the assignment kept at path ("" = none).
func openUIDTable(path string, first, last uint32) (*uidTable, error) {
	t := &uidTable{first: first, last: last, path: path, assigned: map[string]uint32{}, used: map[uint32]bool{}}
	if path == "" {
		return t, nil
	}
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return t, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read uid assignments: %w", err)
	}
	var f uidFile
	if err := json.Unmarshal(data, &f); err != nil || f.Version != 1 {
		return nil, fmt.Errorf("read uid assignments %s: not a version 1 file (%v); it records which uid each project runs as: restore it from a backup rather than delete it", path, err)
	}
	for k, uid := range f.Assigned {
		t.assigned[k] = uid
		t.used[uid] = true
	}
	return t, nil
}

// uid returns team/project's uid, assigning and recording one the first
// time: the project's hash picks where to start looking in the range, so
// that the same project tends to get the same uid even without the file,
// and taken uids (or ones with a passwd entry) are skipped.
func (t *uidTable) uid(team, project string) (uint32, error) {
	key := team + "/" + project
	t.mu.Lock()
	defer t.mu.Unlock()
	if uid, ok := t.assigned[key]; ok {
		return uid, nil
	}
	size := uint64(t.last-t.first) + 1
	h := fnv.New64a()
	h.Write([]byte(key))
	start := h.Sum64() % size
	for i := uint64(0); i < size; i++ {
		uid := t.first + uint32((start+i)%size)
		if t.used[uid] {
			continue
		}
		if _, err := user.LookupId(strconv.FormatUint(uint64(uid), 10)); err == nil {
			continue // a real user of the system
		}
		t.assigned[key] = uid
		t.used[uid] = true
		if err := t.save(); err != nil {
			delete(t.assigned, key)
			delete(t.used, uid)
			return 0, err
		}
		return uid, nil
	}
	return 0, fmt.Errorf("replica.uidRange %d-%d is used up (%d projects have a uid): widen it", t.first, t.last, len(t.assigned))
}

// save writes the table atomically. Callers hold mu.
func (t *uidTable) save() error {
	if t.path == "" || t.readOnly {
		return nil
	}
	data, err := json.MarshalIndent(uidFile{Version: 1, Assigned: t.assigned}, "", "  ")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(t.path), 0o700); err != nil {
		return fmt.Errorf("save uid assignments: %w", err)
	}
	// A uid handed out must survive a crash, rename included, or it could be
	// handed out twice.
	err = durable.Replace(t.path, func(w io.Writer) error {
		_, err := w.Write(append(data, '\n'))
		return err
	})
	if err != nil {
		return fmt.Errorf("save uid assignments: %w", err)
	}
	return nil
}

// perProjectRunAs is the RunAs of a project's own uid: no name in the
// user database, so the name is the number, for USER and LOGNAME.
func perProjectRunAs(uid uint32) *RunAs {
	name := strconv.FormatUint(uint64(uid), 10)
	return &RunAs{Name: name, UID: uid, GID: uid, Groups: []uint32{}}
}

// privileges are the capabilities the sandbox needs, as the daemon holds
// them (root holds all).
type privileges struct {
	switchUser bool // CAP_SETUID and CAP_SETGID: run models as other users
	chown      bool // CAP_CHOWN: give a model its private directory
	netns      bool // CAP_SYS_ADMIN and CAP_NET_ADMIN: network namespaces
	sysAdmin   bool // CAP_SYS_ADMIN: PID and mount namespaces, and mounts in them
}

// effectivePrivileges reads the daemon's effective capabilities.
func effectivePrivileges() privileges {
	hdr := unix.CapUserHeader{Version: unix.LINUX_CAPABILITY_VERSION_3}
	var data [2]unix.CapUserData
	if err := unix.Capget(&hdr, &data[0]); err != nil {
		return privileges{}
	}
	has := func(c int) bool { return data[c/32].Effective&(1<<(uint(c)%32)) != 0 }
	return privileges{
		switchUser: has(unix.CAP_SETUID) && has(unix.CAP_SETGID),
		chown:      has(unix.CAP_CHOWN),
		netns:      has(unix.CAP_SYS_ADMIN) && has(unix.CAP_NET_ADMIN),
		sysAdmin:   has(unix.CAP_SYS_ADMIN),
	}
}

// Private directories: each replica gets HOME and TMPDIR in a directory of
// its own, owned by its user with mode 0700, removed when it ends. They live
// under one directory of the daemon's user in the system temp dir, mode
// 0711: a model may reach its own directory but list no other.

// privateDirs makes and removes replicas' private directories.
type privateDirs struct {
	base string
}

// newPrivateDirs prepares base.
func newPrivateDirs(base string) (*privateDirs, error) {
	if err := ownedDir(base, 0o711); err != nil {
		return nil, fmt.Errorf("private replica dirs: %w", err)
	}
	return &privateDirs{base: base}, nil
}

// make creates the private directory of replica id for runAs (nil = the
// daemon's own user). One left by an earlier run is removed first.
func (d *privateDirs) make(id string, runAs *RunAs) (string, error) {
	dir := filepath.Join(d.base, id)
	if err := d.remove(dir); err != nil {
		return "", err
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return "", fmt.Errorf("private dir: %w", err)
	}
	if runAs != nil {
		if err := os.Chown(dir, int(runAs.UID), int(runAs.GID)); err != nil {
			os.Remove(dir)
			return "", fmt.Errorf("private dir: %w", err)
		}
	}
	return dir, nil
}

// remove deletes a private directory and what the model put in it. The
// contents are deleted with the file-system identity of the directory's
// owner (setfsuid on a thread of their own), never with the daemon's: a
// model that swapped in a link to a file of the daemon's can only make it
// delete what the model could delete itself, and the daemon needs no
// CAP_DAC_OVERRIDE to clear a directory the model made unreadable.
func (d *privateDirs) remove(dir string) error {
	fi, err := os.Lstat(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("remove private dir: %w", err)
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	if fi.IsDir() && ok && int(st.Uid) != os.Geteuid() {
		if err := removeContentsAs(dir, int(st.Uid), int(st.Gid)); err != nil {
			return fmt.Errorf("remove private dir: %w", err)
		}
	}
	if err := os.RemoveAll(dir); err != nil {
		return fmt.Errorf("remove private dir: %w", err)
	}
	return nil
}

// removeContentsAs empties dir as user uid:gid: each directory is made
// usable by its owner (chmod u+rwx) before it is read, then everything is
// removed, dir itself staying.
func removeContentsAs(dir string, uid, gid int) error {
	done := make(chan error, 1)
	go func() {
		// Never unlocked: the thread's file-system ids are not the
		// daemon's any more, so it ends with this goroutine.
		runtime.LockOSThread()
		unix.SetfsgidRetGid(gid)
		unix.SetfsuidRetUid(uid)
		// setfsuid reports no error: asking for an impossible id (-1) returns
		// the one in force.
		if got, _ := unix.SetfsuidRetUid(-1); got != uid {
			done <- fmt.Errorf("cannot act as uid %d to clear %s", uid, dir)
			return
		}
		filepath.WalkDir(dir, func(path string, e fs.DirEntry, err error) error {
			if e != nil && e.IsDir() {
				os.Chmod(path, 0o700) // so that it can be read next, and emptied
			}
			return nil
		})
		entries, err := os.ReadDir(dir)
		var errs []error
		for _, e := range entries {
			errs = append(errs, os.RemoveAll(filepath.Join(dir, e.Name())))
		}
		done <- errors.Join(append(errs, err)...)
	}()
	return <-done
}

// clear removes every private directory left under the base (after a
// daemon that died).
func (d *privateDirs) clear() error {
	entries, err := os.ReadDir(d.base)
	if err != nil {
		return fmt.Errorf("clear private dirs: %w", err)
	}
	var errs []error
	for _, e := range entries {
		errs = append(errs, d.remove(filepath.Join(d.base, e.Name())))
	}
	return errors.Join(errs...)
}

// ownedDir creates (or reuses) dir with mode perm, owned by the daemon's
// user. dir sits in a world-writable place such as /tmp, so a directory
// someone else created there is refused, never used.
func ownedDir(dir string, perm os.FileMode) error {
	if err := os.Mkdir(dir, perm); err != nil && !errors.Is(err, os.ErrExist) {
		return err
	}
	fi, err := os.Lstat(dir)
	if err != nil {
		return err
	}
	st, ok := fi.Sys().(*syscall.Stat_t)
	switch {
	case !fi.IsDir():
		return fmt.Errorf("%s is not a directory", dir)
	case !ok || int(st.Uid) != os.Geteuid():
		return fmt.Errorf("%s belongs to another user; remove it", dir)
	case fi.Mode().Perm()&0o022 != 0:
		return fmt.Errorf("%s is writable by others; remove it", dir)
	}
	return os.Chmod(dir, perm)
}
