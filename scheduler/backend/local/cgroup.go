package local

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A cgroup per replica: the box its whole process tree lives in. The replica
// enters it at fork, so nothing it starts is ever outside; stopping it, or
// cleaning up after a daemon that died, kills everything in it at once
// (cgroup.kill), a setsid or double-forked child included; and the project's
// memoryMiB and pidsMax are its limits.
//
// cgroup v2 is the target. A host may mount a controller only as v1 (CI
// machines here mount memory and pids as v1 beside a v2 hierarchy that has
// neither): such a controller gets a v1 cgroup of its own, entered at fork
// too (see cgroupV1.join). What is mounted is read from /proc, never assumed.
//
// Where the cgroups go:
//   - as root: <v2 mount>/inferd/<instance>/<replica>, and for a v1
//     controller <mount>/<the daemon's own cgroup>/inferd/<instance>/<replica>;
//   - otherwise, in the cgroup systemd delegated to the service
//     (Delegate=yes): the daemon moves itself into <own>/daemon, so that its
//     own cgroup has no processes and may hand controllers to its children
//     (cgroup v2's "no internal processes" rule), and replicas go to
//     <own>/replicas/<instance>-<replica>... (see newCgroups).
//
// instance names the daemon's data dir (a hash of its run dir), so a
// restarted daemon finds what the previous one left (Recover) and two
// daemons with different data dirs never share a cgroup.

const (
	cgroupRoot  = "inferd"   // the directory of all daemons' cgroups when root
	daemonLeaf  = "daemon"   // where a delegated daemon moves itself
	replicasDir = "replicas" // a delegated daemon's replicas, under its own cgroup
)

// cgroupKillWait bounds how long a killed cgroup may take to empty.
const cgroupKillWait = 10 * time.Second

// eventsRecheck is how often waitPopulated reads cgroup.events without a
// signal from the kernel.
const eventsRecheck = 100 * time.Millisecond

// cgroups makes the cgroup of each replica, in whatever hierarchies the
// host offers. A nil *cgroups makes none.
type cgroups struct {
	v2     string          // base of the replicas' v2 cgroups; "" = no v2
	v2Kill bool            // cgroup.kill exists (Linux 5.14+)
	v2Ctl  map[string]bool // controllers enabled for the replicas in v2
	v1     map[string]v1Base
	// why records, per controller (and "kill" for the process tree), why it
	// is not in force, for Protections.
	why map[string]string
}

// v1Base is one v1 controller's hierarchy: where replicas' cgroups go, and
// the daemon's own cgroup, which the forking thread returns to.
type v1Base struct {
	base, own string
}

// limited are the controllers a replica's limits need.
var limited = []string{"memory", "pids"}

// mount is a cgroup hierarchy as /proc/self/mountinfo shows it.
type mount struct {
	dir, root   string // where it is mounted, and which of its cgroups is there
	controllers []string
}

// cgroupMounts reads the cgroup hierarchies from mountinfo: the v2 one (at
// most one is used) and each v1 controller's.
func cgroupMounts(mountinfo []byte) (v2 *mount, v1 map[string]mount) {
	v1 = map[string]mount{}
	sc := bufio.NewScanner(bytes.NewReader(mountinfo))
	for sc.Scan() {
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		f, g := strings.Fields(pre), strings.Fields(post)
		if !ok || len(f) < 5 || len(g) < 3 {
			continue
		}
		m := mount{dir: unescapeMount(f[4]), root: unescapeMount(f[3])}
		switch g[0] {
		case "cgroup2":
			if v2 == nil {
				v2 = &m
			}
		case "cgroup":
			for _, opt := range strings.Split(g[2], ",") {
				switch opt {
				case "memory", "pids", "devices", "freezer":
					if _, dup := v1[opt]; !dup {
						m.controllers = append(m.controllers, opt)
						v1[opt] = m
					}
				}
			}
		}
	}
	return v2, v1
}

// unescapeMount undoes mountinfo's octal escapes (\040 for a space).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// ownCgroups reads /proc/self/cgroup: the daemon's cgroup in v2 ("" key) and
// in each v1 controller's hierarchy.
func ownCgroups(procCgroup []byte) map[string]string {
	own := map[string]string{}
	for _, line := range strings.Split(string(procCgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			own[""] = parts[2]
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			own[c] = parts[2]
		}
	}
	return own
}

// cgroupDir is where cgroup path (as /proc/self/cgroup names it) is found
// under m: the mount may show a sub-tree (m.root), as in a container.
func cgroupDir(m mount, path string) (string, bool) {
	rel, ok := strings.CutPrefix(path, m.root)
	if !ok || (rel != "" && m.root != "/" && !strings.HasPrefix(rel, "/")) {
		return "", false
	}
	return filepath.Join(m.dir, rel), true
}

// cgroupSetup is what newCgroups needs to know of the daemon.
type cgroupSetup struct {
	instance string // names this daemon's cgroups
	root     bool   // the daemon may make cgroups anywhere (euid 0)
	v1Extra  []string
}

// newCgroups finds where replicas' cgroups can go and prepares their parent
// directories. It returns nil, with the reason, when no cgroup can be made
// (not root and no delegated cgroup, or no cgroup filesystem).
func newCgroups(s cgroupSetup) (*cgroups, string) {
	info, err1 := os.ReadFile("/proc/self/mountinfo")
	self, err2 := os.ReadFile("/proc/self/cgroup")
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Sprintf("cannot read /proc: %v", err)
	}
	v2m, v1m := cgroupMounts(info)
	own := ownCgroups(self)
	cg := &cgroups{v2Ctl: map[string]bool{}, v1: map[string]v1Base{}, why: map[string]string{}}

	if v2m != nil {
		if ownPath, ok := own[""]; ok {
			if dir, ok := cgroupDir(*v2m, ownPath); ok {
				cg.setupV2(v2m.dir, dir, s)
			}
		}
		if cg.v2 == "" && cg.why["kill"] == "" {
			cg.why["kill"] = "the daemon's cgroup v2 is not under " + v2m.dir
		}
	} else {
		cg.why["kill"] = "no cgroup v2 mounted"
	}
	for _, c := range append(append([]string(nil), limited...), s.v1Extra...) {
		if cg.v2Ctl[c] {
			continue
		}
		m, ok := v1m[c]
		if !ok {
			if cg.why[c] == "" {
				cg.why[c] = "no " + c + " controller in cgroup v2 or v1"
			}
			continue
		}
		ownDir, ok := cgroupDir(m, own[c])
		if !ok {
			cg.why[c] = "the daemon's cgroup v1 " + c + " is not under " + m.dir
			continue
		}
		base := filepath.Join(ownDir, cgroupRoot, s.instance)
		if err := os.MkdirAll(base, 0o755); err != nil {
			cg.why[c] = fmt.Sprintf("the host mounts %s only as cgroup v1, where inferd cannot make a cgroup (%v; systemd delegates only v2)", c, errBrief(err))
			continue
		}
		cg.v1[c] = v1Base{base: base, own: ownDir}
		delete(cg.why, c)
	}
	if cg.v2 == "" && len(cg.v1) == 0 {
		return nil, cg.why["kill"]
	}
	return cg, ""
}

// setupV2 prepares the v2 base: as root under the hierarchy's root, else in
// the daemon's own cgroup when systemd delegated it.
func (cg *cgroups) setupV2(mountDir, ownDir string, s cgroupSetup) {
	var parent string
	if s.root {
		parent = filepath.Join(mountDir, cgroupRoot)
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			cg.why["kill"] = fmt.Sprintf("cannot make %s: %v", parent, errBrief(err))
			return
		}
		cg.enable(mountDir) // the root cgroup may hold processes and still hand out controllers
	} else {
		if unix.Access(filepath.Join(ownDir, "cgroup.procs"), unix.W_OK) != nil ||
			unix.Access(filepath.Join(ownDir, "cgroup.subtree_control"), unix.W_OK) != nil {
			cg.why["kill"] = "not root, and the daemon's cgroup " + ownDir + " is not delegated to it (systemd Delegate=yes)"
			return
		}
		// A cgroup with processes cannot hand controllers to its children:
		// move the daemon into a leaf of its own first.
		leaf := filepath.Join(ownDir, daemonLeaf)
		if filepath.Base(ownDir) == daemonLeaf {
			leaf, ownDir = ownDir, filepath.Dir(ownDir) // a restart within the same cgroup
		} else {
			if err := os.Mkdir(leaf, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
				cg.why["kill"] = fmt.Sprintf("cannot make %s: %v", leaf, errBrief(err))
				return
			}
			if err := os.WriteFile(filepath.Join(leaf, "cgroup.procs"), []byte("0"), 0); err != nil {
				cg.why["kill"] = fmt.Sprintf("cannot move the daemon into %s: %v", leaf, errBrief(err))
				return
			}
		}
		parent = filepath.Join(ownDir, replicasDir)
		if err := os.Mkdir(parent, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
			cg.why["kill"] = fmt.Sprintf("cannot make %s: %v", parent, errBrief(err))
			return
		}
		cg.enable(ownDir)
	}
	cg.enable(parent)
	base := filepath.Join(parent, s.instance)
	if err := os.Mkdir(base, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		cg.why["kill"] = fmt.Sprintf("cannot make %s: %v", base, errBrief(err))
		return
	}
	cg.v2Ctl = cg.enable(base)
	cg.v2 = base
	if _, err := os.Stat(filepath.Join(base, "cgroup.kill")); err == nil {
		cg.v2Kill = true
	}
	for _, c := range limited {
		if !cg.v2Ctl[c] {
			cg.why[c] = "no " + c + " controller in cgroup v2"
		}
	}
}

// enable hands the limited controllers that dir has to its children, and
// returns those it could.
func (cg *cgroups) enable(dir string) map[string]bool {
	have, _ := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	on := map[string]bool{}
	for _, c := range strings.Fields(string(have)) {
		for _, want := range limited {
			if c != want {
				continue
			}
			// One write per controller: one the kernel refuses must not
			// keep the other off.
			if os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c), 0) == nil {
				on[c] = true
			}
		}
	}
	return on
}

// errBrief is an error without the path the caller already names.
func errBrief(err error) error {
	var pe *os.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	return err
}

// limits are what a replica's cgroup enforces; zero = no limit.
type limits struct {
	memoryMiB, pidsMax int
}

// replicaCgroup is one replica's cgroups.
type replicaCgroup struct {
	cg     *cgroups
	v2     string            // its v2 cgroup; "" = none
	v2fd   int               // an O_PATH descriptor of v2, for CgroupFD; -1 = none
	v1     map[string]string // controller → its v1 cgroup
	limits limits
	meter  cgroupMeter // the usage meter's open files (meter.go)
}

// create makes the cgroups of replica name, with its limits. A cgroup of
// that name left by an earlier run is emptied and made afresh.
func (cg *cgroups) create(name string, l limits) (*replicaCgroup, error) {
	rc := &replicaCgroup{cg: cg, v2fd: -1, v1: map[string]string{}, limits: l}
	ok := false
	defer func() {
		if !ok {
			rc.remove()
		}
	}()
	if cg.v2 != "" {
		dir := filepath.Join(cg.v2, name)
		if err := mkCgroup(dir, func() { cg.killDir(dir, true) }); err != nil {
			return nil, err
		}
		rc.v2 = dir
		if cg.v2Ctl["memory"] && l.memoryMiB > 0 {
			if err := writeCgroup(dir, "memory.max", strconv.Itoa(l.memoryMiB<<20)); err != nil {
				return nil, err
			}
			// No swap, or the limit would only make the model slow; and one
			// process out of memory ends the whole replica, as it would on
			// v1 once the leader is gone.
			writeCgroup(dir, "memory.swap.max", "0")
			writeCgroup(dir, "memory.oom.group", "1")
		}
		if cg.v2Ctl["pids"] && l.pidsMax > 0 {
			// Room for the init's threads while it starts (see setPidsMax).
			if err := writeCgroup(dir, "pids.max", strconv.Itoa(l.pidsMax+initTasks)); err != nil {
				return nil, err
			}
		}
		fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, fmt.Errorf("open cgroup %s: %w", dir, err)
		}
		rc.v2fd = fd
	}
	for c, b := range cg.v1 {
		dir := filepath.Join(b.base, name)
		if err := mkCgroup(dir, func() { cg.killDir(dir, false) }); err != nil {
			return nil, err
		}
		rc.v1[c] = dir
		var err error
		switch {
		case c == "memory" && l.memoryMiB > 0:
			limit := strconv.Itoa(l.memoryMiB << 20)
			err = writeCgroup(dir, "memory.limit_in_bytes", limit)
			writeCgroup(dir, "memory.memsw.limit_in_bytes", limit) // only with swap accounting
		case c == "pids" && l.pidsMax > 0:
			// One more while the forking thread is in it (see join), and
			// room for the init's threads while it starts.
			err = writeCgroup(dir, "pids.max", strconv.Itoa(l.pidsMax+initTasks+1))
		}
		if err != nil {
			return nil, err
		}
	}
	ok = true
	return rc, nil
}

// mkCgroup makes dir; one that exists (a replica of the same id left by a
// daemon that died) is emptied with clear and made afresh.
func mkCgroup(dir string, clear func()) error {
	err := os.Mkdir(dir, 0o755)
	if errors.Is(err, os.ErrExist) {
		clear()
		if err = syscall.Rmdir(dir); err == nil {
			err = os.Mkdir(dir, 0o755)
		}
	}
	if err != nil {
		return fmt.Errorf("make cgroup %s: %w", dir, err)
	}
	return nil
}

// cgroupGone reports whether err says the cgroup was removed meanwhile (by
// the replica's own end, while Recover looked at it).
func cgroupGone(err error) bool {
	return errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ENODEV)
}

func writeCgroup(dir, file, value string) error {
	if err := os.WriteFile(filepath.Join(dir, file), []byte(value), 0); err != nil {
		return fmt.Errorf("cgroup %s: %w", filepath.Join(dir, file), errBrief(err))
	}
	return nil
}

// join moves the calling thread into rc's v1 cgroups, so that the child it
// forks next starts in them: v1 has no CgroupFD, but a child starts in its
// forking thread's cgroups, and v1 places threads one by one. The caller is
// locked to its thread and calls leave once the child runs.
func (rc *replicaCgroup) join() error {
	tid := []byte(strconv.Itoa(unix.Gettid()))
	for c, dir := range rc.v1 {
		if err := os.WriteFile(filepath.Join(dir, "tasks"), tid, 0); err != nil {
			return fmt.Errorf("enter cgroup v1 %s: %w", c, errBrief(err))
		}
	}
	return nil
}

// leave moves the calling thread back to the daemon's own v1 cgroups.
func (rc *replicaCgroup) leave() error {
	tid := []byte(strconv.Itoa(unix.Gettid()))
	var errs []error
	for c := range rc.v1 {
		if err := os.WriteFile(filepath.Join(rc.cg.v1[c].own, "tasks"), tid, 0); err != nil {
			errs = append(errs, fmt.Errorf("leave cgroup v1 %s: %w", c, errBrief(err)))
		}
	}
	return errors.Join(errs...)
}

// setPidsMax sets the replica's pids.max, once its model runs, to n: the
// project's figure and what its init keeps (see box.started). A figure
// below what the replica holds already only keeps it from starting more.
func (rc *replicaCgroup) setPidsMax(n int) error {
	var errs []error
	if rc.v2 != "" && rc.cg.v2Ctl["pids"] {
		errs = append(errs, writeCgroup(rc.v2, "pids.max", strconv.Itoa(n)))
	}
	if dir, ok := rc.v1["pids"]; ok {
		errs = append(errs, writeCgroup(dir, "pids.max", strconv.Itoa(n)))
	}
	return errors.Join(errs...)
}

// threads is how many threads process pid has, from /proc.
func threads(pid int) (int, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "Threads:"); ok {
			return strconv.Atoi(strings.TrimSpace(v))
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no Threads line", pid)
}

// fd is the descriptor for SysProcAttr.CgroupFD, or -1 without v2.
func (rc *replicaCgroup) fd() int { return rc.v2fd }

// kill kills every process in rc and waits until they are gone.
func (rc *replicaCgroup) kill() error {
	switch {
	case rc.v2 != "":
		return rc.cg.killDir(rc.v2, true)
	default:
		for _, dir := range rc.v1 {
			return rc.cg.killDir(dir, false) // every process is in each of them
		}
	}
	return nil
}

// killDir kills every process in the cgroup at dir and waits, up to
// cgroupKillWait, for it to be empty.
func (cg *cgroups) killDir(dir string, v2 bool) error {
	if v2 && cg.v2Kill {
		if err := writeCgroup(dir, "cgroup.kill", "1"); err != nil {
			if cgroupGone(err) {
				return nil
			}
			return err
		}
		return waitPopulated(dir)
	}
	// No cgroup.kill: signal the members one by one until none is left.
	// Only killed processes leave, so the list shrinks; a process forking
	// meanwhile lands in the same cgroup and is found on the next round.
	deadline := time.Now().Add(cgroupKillWait)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 50*time.Millisecond) {
		pids, err := cgroupPids(dir)
		if err != nil || len(pids) == 0 {
			return err
		}
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("cgroup %s: %d processes still there %s after SIGKILL", dir, len(pids), cgroupKillWait)
		}
		time.Sleep(pause) // dying processes have no event of their own to wait on here
	}
}

// cgroupPids lists the processes in the cgroup at dir; a cgroup that is gone
// has none.
func cgroupPids(dir string) ([]int, error) {
	data, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if cgroupGone(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	return pids, nil
}

// waitPopulated waits until the v2 cgroup at dir has no process left: the
// kernel reports it in cgroup.events and signals each change of the file to
// inotify. The file is read again at least every eventsRecheck too: the
// kernel drops a pending signal when the cgroup is removed meanwhile (by
// Recover, racing the replica's own end), and a removed cgroup is empty.
func waitPopulated(dir string) error {
	events := filepath.Join(dir, "cgroup.events")
	ino, err := unix.InotifyInit1(unix.IN_CLOEXEC | unix.IN_NONBLOCK)
	if err != nil {
		return fmt.Errorf("wait for cgroup %s: %w", dir, err)
	}
	defer unix.Close(ino)
	if _, err := unix.InotifyAddWatch(ino, events, unix.IN_MODIFY); err != nil {
		if cgroupGone(err) {
			return nil
		}
		return fmt.Errorf("wait for cgroup %s: %w", dir, err)
	}
	deadline := time.Now().Add(cgroupKillWait)
	buf := make([]byte, 4096)
	for {
		data, err := os.ReadFile(events)
		if cgroupGone(err) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("wait for cgroup %s: %w", dir, err)
		}
		if bytes.Contains(data, []byte("populated 0")) {
			return nil
		}
		left := time.Until(deadline)
		if left <= 0 {
			return fmt.Errorf("cgroup %s still has processes %s after it was killed", dir, cgroupKillWait)
		}
		fds := []unix.PollFd{{Fd: int32(ino), Events: unix.POLLIN}}
		if _, err := unix.Poll(fds, int(min(left, eventsRecheck)/time.Millisecond)+1); err != nil && !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("wait for cgroup %s: %w", dir, err)
		}
		unix.Read(ino, buf) // drain; the file is read again either way
	}
}

// oomKills is how many processes the kernel killed in rc for going over its
// memory limit.
func (rc *replicaCgroup) oomKills() int {
	switch {
	case rc.v2 != "" && rc.cg.v2Ctl["memory"]:
		return counter(filepath.Join(rc.v2, "memory.events"), "oom_kill")
	case rc.v1["memory"] != "":
		return counter(filepath.Join(rc.v1["memory"], "memory.oom_control"), "oom_kill")
	}
	return 0
}

// counter reads the "name N" line of a cgroup's flat-keyed file.
func counter(path, name string) int {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	n, _ := flatKeyed(data, name)
	return int(n)
}

// flatKeyed finds the "name N" line in the content of a cgroup's
// flat-keyed file (memory.events, cpu.stat, ...).
func flatKeyed(data []byte, name string) (int64, bool) {
	for line := range bytes.Lines(data) {
		if k, v, ok := bytes.Cut(line, []byte(" ")); ok && string(k) == name {
			n, err := strconv.ParseInt(string(bytes.TrimSpace(v)), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// remove deletes rc's cgroups, which must be empty, and closes its fd.
func (rc *replicaCgroup) remove() error {
	rc.meter.close()
	var errs []error
	if rc.v2fd >= 0 {
		unix.Close(rc.v2fd)
		rc.v2fd = -1
	}
	if rc.v2 != "" {
		errs = append(errs, rmCgroup(rc.v2))
	}
	for _, dir := range rc.v1 {
		errs = append(errs, rmCgroup(dir))
	}
	return errors.Join(errs...)
}

func rmCgroup(dir string) error {
	if err := syscall.Rmdir(dir); err != nil && !cgroupGone(err) {
		return fmt.Errorf("remove cgroup %s: %w", dir, err)
	}
	return nil
}

// recover kills every replica cgroup a previous daemon of this instance
// left, and removes them. It returns how many held processes.
func (cg *cgroups) recover() (int, error) {
	var errs []error
	busy := map[string]bool{}
	sweep := func(base string, v2 bool) {
		entries, err := os.ReadDir(base)
		if err != nil {
			if !errors.Is(err, os.ErrNotExist) {
				errs = append(errs, err)
			}
			return
		}
		for _, e := range entries {
			if !e.IsDir() {
				continue
			}
			dir := filepath.Join(base, e.Name())
			if pids, _ := cgroupPids(dir); len(pids) > 0 {
				busy[e.Name()] = true
			}
			if err := cg.killDir(dir, v2); err != nil {
				errs = append(errs, err)
				continue
			}
			errs = append(errs, rmCgroup(dir))
		}
	}
	if cg.v2 != "" {
		sweep(cg.v2, true)
	}
	for _, b := range cg.v1 {
		sweep(b.base, false)
	}
	if err := errors.Join(errs...); err != nil {
		return len(busy), fmt.Errorf("clean up cgroups: %w", err)
	}
	return len(busy), nil
}

// close removes the directories newCgroups made for this instance, when
// empty (they are not while replicas run).
func (cg *cgroups) close() {
	if cg.v2 != "" {
		syscall.Rmdir(cg.v2)
	}
	for _, b := range cg.v1 {
		syscall.Rmdir(b.base)
		syscall.Rmdir(filepath.Dir(b.base))
	}
}
