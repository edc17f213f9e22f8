package local

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/rs/zerolog"

	"inferd/scheduler/backend"
	"inferd/store"
)

// The sandbox: every replica in its own box (docs/security.md). What the
// box is made of is decided once, by New, from the configuration and from
// what this machine and the daemon's privileges allow: identity.go (who it
// runs as, its private directory), cgroup.go (its process tree and limits)
// and netns.go (its network). Whatever is missing, the daemon runs without
// it and says so (Protections).

// sandbox is the backend's part that boxes replicas.
type sandbox struct {
	priv      privileges
	identity  identityMode
	named     *RunAs    // identityNamed: the one user of all projects
	uids      *uidTable // identityPerProject
	cgroups   *cgroups  // nil = no cgroup per replica
	cgWhy     string    // why cgroups is nil
	netnsErr  error     // why no private network namespace can be made; nil = it can
	nsErr     error     // why replicas get no PID and mount namespaces; nil = they do
	filterErr error     // why models may make user namespaces whatever their project says
	network   string    // the default of a project's network
	dirs      *privateDirs
	devices   *deviceIsolation
}

type identityMode int

const (
	identityOwn        identityMode = iota // the daemon's own user: it cannot switch
	identityRoot                           // replica.user: root
	identityNamed                          // replica.user: NAME
	identityPerProject                     // a uid per project
)

// newSandbox sets up what cfg asks for, as far as this machine allows.
func newSandbox(cfg Config) (*sandbox, error) {
	sb := &sandbox{priv: effectivePrivileges(), network: cfg.Network}
	if sb.network == "" {
		sb.network = store.NetworkPrivate
	}
	switch user := cfg.User; {
	case !sb.priv.switchUser:
		sb.identity = identityOwn
	case user == "root" || user == "0":
		sb.identity = identityRoot
	case user == "" || user == PerProject:
		if !sb.priv.chown {
			return nil, errors.New("config: replica.user: per-project needs CAP_CHOWN beside CAP_SETUID and CAP_SETGID, to give each replica its private directory; grant it or name a user")
		}
		first, last := cfg.UIDFirst, cfg.UIDLast
		if first == 0 && last == 0 {
			first, last = DefaultUIDFirst, DefaultUIDLast
		}
		uids, err := openUIDTable(cfg.UIDFile, first, last)
		if err != nil {
			return nil, err
		}
		uids.readOnly = cfg.ReadOnlyUIDs
		sb.identity, sb.uids = identityPerProject, uids
	default:
		runAs, err := LookupRunAs(user)
		if err != nil {
			return nil, fmt.Errorf("config: replica.user: %w", err)
		}
		sb.identity, sb.named = identityNamed, runAs
	}

	instance := instanceName(cfg.RunDir)
	if cfg.NoCgroups {
		sb.cgWhy = "replica.cgroups is false"
	} else {
		sb.cgroups, sb.cgWhy = newCgroups(cgroupSetup{instance: instance, root: os.Geteuid() == 0, v1Extra: []string{"devices"}})
	}
	devDir := cfg.DevDir
	if devDir == "" {
		devDir = "/dev"
	}
	sb.devices = newDeviceIsolation(devDir, cfg.GPUs, sb.cgroups, sb.cgWhy)
	if sb.network == store.NetworkPrivate {
		sb.netnsErr = canMakeNetns()
	}
	sb.nsErr = errors.New("they need root or CAP_SYS_ADMIN")
	if sb.priv.sysAdmin {
		sb.nsErr = probeNamespaces()
	}
	sb.filterErr = probeFilter()
	dirs, err := newPrivateDirs(filepath.Join(os.TempDir(), fmt.Sprintf("inferd-%d-%s", os.Geteuid(), instance)))
	if err != nil {
		return nil, err
	}
	sb.dirs = dirs
	return sb, nil
}

// instanceName names the daemon that owns runDir: the same after a restart,
// different for another data dir. Without a run dir (nothing to recover) it
// is random.
func instanceName(runDir string) string {
	if runDir == "" {
		b := make([]byte, 8)
		rand.Read(b)
		return "x" + hex.EncodeToString(b)
	}
	if abs, err := filepath.Abs(runDir); err == nil {
		runDir = abs
	}
	sum := sha256.Sum256([]byte(runDir))
	return hex.EncodeToString(sum[:8])
}

// runAs is who spec's replicas run as; nil = the daemon's own user.
func (sb *sandbox) runAs(spec backend.Spec) (*RunAs, error) {
	switch sb.identity {
	case identityNamed:
		return sb.named, nil
	case identityPerProject:
		uid, err := sb.uids.uid(spec.TeamID, spec.ProjectID)
		if err != nil {
			return nil, err
		}
		return perProjectRunAs(uid), nil
	}
	return nil, nil
}

// checkRunAs is who models run as, for a Checker: the named user, a RunAs
// standing for any uid of the range (see Checker.RunAs), or nil.
func (sb *sandbox) checkRunAs() *RunAs {
	switch sb.identity {
	case identityNamed:
		return sb.named
	case identityPerProject:
		return &RunAs{UID: sb.uids.first, GID: sb.uids.first}
	}
	return nil
}

// privateNetwork says whether spec's replicas get a network of their own:
// the project's network, else the daemon's default, when namespaces can be
// made.
func (sb *sandbox) privateNetwork(m store.ModelSpec) bool {
	want := m.Network
	if want == "" {
		want = sb.network
	}
	if want != store.NetworkPrivate {
		return false
	}
	if sb.netnsErr != nil {
		// Checked at start-up: a namespace that could be made then can be
		// made now. This one could not, and Protections says so.
		return false
	}
	return true
}

// Protections says which protections replicas started from now on get.
func (b *Backend) Protections() []backend.Protection {
	sb := b.sb
	on := func(name, detail string) backend.Protection {
		return backend.Protection{Name: name, On: true, Detail: detail}
	}
	off := func(name, detail string) backend.Protection {
		return backend.Protection{Name: name, Detail: detail}
	}
	var out []backend.Protection

	switch sb.identity {
	case identityPerProject:
		out = append(out, on(backend.ProtectionIdentity, fmt.Sprintf("a uid per project from replica.uidRange %d-%d", sb.uids.first, sb.uids.last)))
	case identityNamed:
		out = append(out, off(backend.ProtectionIdentity, fmt.Sprintf("every project runs as user %s (uid %d) (replica.user): models of different projects can read and signal each other's processes; per-project gives each its own uid", sb.named.Name, sb.named.UID)))
	case identityRoot:
		out = append(out, off(backend.ProtectionIdentity, "models run as root (replica.user: root): a model can do anything inferd can"))
	default:
		out = append(out, off(backend.ProtectionIdentity, fmt.Sprintf("models run as inferd's own user (uid %d): switching users needs root or CAP_SETUID, CAP_SETGID and CAP_CHOWN", os.Geteuid())))
	}

	cg := sb.cgroups
	switch {
	case cg == nil:
		out = append(out, off(backend.ProtectionProcessTree, "no cgroup per replica ("+sb.cgWhy+"): a stop kills the replica's process group, and a child that left it (setsid) survives"))
	case cg.v2 != "" && cg.v2Kill:
		out = append(out, on(backend.ProtectionProcessTree, "a cgroup per replica under "+cg.v2+", killed whole (cgroup.kill)"))
	case cg.v2 != "":
		out = append(out, on(backend.ProtectionProcessTree, "a cgroup per replica under "+cg.v2+", each process in it killed (no cgroup.kill: Linux before 5.14)"))
	default:
		out = append(out, on(backend.ProtectionProcessTree, "a cgroup v1 per replica, each process in it killed ("+cg.why["kill"]+")"))
	}
	if sb.nsErr == nil {
		out = append(out, on(backend.ProtectionPIDNamespace, "a PID namespace per replica with its own /proc, whose first process (inferd's init) dies with inferd (parent-death signal), even on kill -9, and the kernel then ends every process in it"))
	} else {
		out = append(out, off(backend.ProtectionPIDNamespace, fmt.Sprintf("no PID namespace per replica (%v): models see every process of the box in /proc (other teams' command lines, inferd's --config), and a child that left its process group outlives an inferd killed with kill -9 until the next start", errBrief(sb.nsErr))))
	}
	for _, c := range []struct{ name, controller, field string }{
		{backend.ProtectionMemoryLimit, "memory", "memoryMiB"},
		{backend.ProtectionPidsLimit, "pids", "pidsMax"},
	} {
		switch {
		case cg == nil:
			out = append(out, off(c.name, "no cgroup per replica: a project's "+c.field+" is not enforced"))
		case cg.v2Ctl[c.controller]:
			out = append(out, on(c.name, "a project's "+c.field+", by cgroup v2"))
		case cg.v1[c.controller].base != "":
			out = append(out, on(c.name, "a project's "+c.field+", by cgroup v1 (the host mounts "+c.controller+" only as v1)"))
		default:
			out = append(out, off(c.name, cg.why[c.controller]+": a project's "+c.field+" is not enforced"))
		}
	}

	switch {
	case sb.network != store.NetworkPrivate:
		out = append(out, off(backend.ProtectionNetwork, "replica.network: host: models share the host's network unless a project says network: private"))
	case sb.netnsErr != nil:
		out = append(out, off(backend.ProtectionNetwork, fmt.Sprintf("models share the host's network: no network namespace can be made (%v; it needs root or CAP_SYS_ADMIN and CAP_NET_ADMIN)", errBrief(sb.netnsErr))))
	default:
		out = append(out, on(backend.ProtectionNetwork, "a network namespace per replica with only loopback (projects with network: host share the host's)"))
	}
	out = append(out, on(backend.ProtectionPrivateDirs, "HOME and TMPDIR in "+sb.dirs.base+"/<replica>, mode 0700, removed when the replica ends"))
	if sb.nsErr == nil {
		out = append(out, on(backend.ProtectionPrivateTmp, "/tmp, /var/tmp and /dev/shm a tmpfs of each replica's own (a mount namespace), each at most its project's memoryMiB and charged to it, gone with the replica; the model's dir, the paths its command names and HOME are bound in"))
	} else {
		out = append(out, off(backend.ProtectionPrivateTmp, fmt.Sprintf("no mount namespace per replica (%v): models share /tmp, /var/tmp and /dev/shm, where what one leaves outlives it and escapes its memoryMiB", errBrief(sb.nsErr))))
	}
	out = append(out, sb.deviceProtection())
	if sb.filterErr == nil {
		out = append(out, on(backend.ProtectionUserNamespaces, "models may not make user namespaces (a seccomp filter on clone, clone3 and unshare) unless their project says allowUserNamespaces: true"))
	} else {
		out = append(out, off(backend.ProtectionUserNamespaces, fmt.Sprintf("no seccomp filter can be installed (%v): a model may make a user namespace, and hold every capability inside it", errBrief(sb.filterErr))))
	}
	out = append(out, b.files)
	return out
}

// logProtections says once, at start-up, which protections are in force.
func logProtections(log zerolog.Logger, ps []backend.Protection) {
	var offs []string
	ev := log.Info()
	for _, p := range ps {
		if !p.On {
			offs = append(offs, p.Name)
		}
	}
	if len(offs) > 0 {
		ev = log.Warn().Strs("off", offs)
	}
	for _, p := range ps {
		state := "on: "
		if !p.On {
			state = "off: "
		}
		ev = ev.Str(p.Name, state+p.Detail)
	}
	msg := "replica sandbox: every protection on"
	if len(offs) > 0 {
		msg = "replica sandbox: " + strings.Join(offs, ", ") + " off"
	}
	ev.Msg(msg)
}

// box is one replica's sandbox, set up by Launch and undone when the
// replica has ended.
type box struct {
	sb      *sandbox
	runAs   *RunAs         // nil = the daemon's own user
	dir     string         // private HOME and TMPDIR
	cg      *replicaCgroup // nil = none
	private bool           // a network namespace of its own
	ns      *netnsDialer   // the dialer into it, live once enter has run
	// namespaces: PID and mount namespaces of its own, whose process 1 is
	// its init (replicainit.go).
	namespaces bool
	// userNamespaces: the model may make user namespaces (its project
	// allows it, or no filter can be installed here).
	userNamespaces bool
}

// newBox sets up spec's box: who it runs as, its private directory and its
// cgroup. undo removes them if the replica never starts.
func (sb *sandbox) newBox(spec backend.Spec) (*box, error) {
	x := &box{
		sb:             sb,
		private:        sb.privateNetwork(spec.Model),
		namespaces:     sb.nsErr == nil,
		userNamespaces: spec.Model.AllowUserNamespaces || sb.filterErr != nil,
	}
	var err error
	if x.runAs, err = sb.runAs(spec); err != nil {
		return nil, err
	}
	if x.dir, err = sb.dirs.make(spec.ReplicaID, x.runAs); err != nil {
		return nil, err
	}
	if sb.cgroups != nil {
		x.cg, err = sb.cgroups.create(spec.ReplicaID, limits{memoryMiB: spec.Model.MemoryMiB, pidsMax: spec.Model.PidsMax})
		if err == nil {
			err = sb.devices.apply(x.cg, spec.GPUs)
		}
		if err != nil {
			x.undo()
			return nil, err
		}
	}
	if x.private {
		x.ns = newNetnsDialer(-1)
	}
	return x, nil
}

// enter puts the calling thread, which is about to fork the replica's
// init, into the box: the network namespace and the v1 cgroups the child
// inherits from it. The capabilities the packaged service holds stay
// until the init has made its mounts: the init drops them, and sets
// no_new_privs, before it starts the model (replicainit.go). The caller is
// locked to its thread and lets it die afterwards; it calls left once the
// child runs.
func (x *box) enter() error {
	if x.private {
		fd, err := enterPrivateNetwork()
		if err != nil {
			return err
		}
		x.ns.set(fd)
	}
	if x.cg != nil {
		if err := x.cg.join(); err != nil {
			return err
		}
	}
	return nil
}

// left takes the forking thread back out of the replica's v1 cgroups.
func (x *box) left() error {
	if x.cg == nil {
		return nil
	}
	return x.cg.leave()
}

// initSlack is what a staying init may grow by, in tasks, beyond the
// threads it holds once the model runs (the Go runtime may start one when
// a thread blocks).
const initSlack = 2

// started sets the replica's pidsMax for good once the model runs (until
// then the cgroup allowed initTasks more, for the init's threads): the
// project's figure, plus the threads of an init that stays (and
// initSlack), so that pidsMax counts the model's processes and threads.
func (x *box) started(initPid int) error {
	if x.cg == nil || x.cg.limits.pidsMax == 0 {
		return nil
	}
	extra := 0
	if x.namespaces {
		n, err := threads(initPid)
		if err != nil {
			return err
		}
		extra = n + initSlack
	}
	return x.cg.setPidsMax(x.cg.limits.pidsMax + extra)
}

// cgroupFD is the descriptor the child is started into (CgroupFD), or -1.
func (x *box) cgroupFD() int {
	if x.cg == nil {
		return -1
	}
	return x.cg.fd()
}

// kill kills everything in the box's cgroup; false when it has none.
func (x *box) kill() (bool, error) {
	if x.cg == nil {
		return false, nil
	}
	return true, x.cg.kill()
}

// oomKills is how many processes of the replica the kernel killed for its
// memory limit.
func (x *box) oomKills() int {
	if x.cg == nil || x.cg.limits.memoryMiB == 0 {
		return 0
	}
	return x.cg.oomKills()
}

// undo removes what newBox made; the replica's processes are gone.
func (x *box) undo() error {
	var errs []error
	if x.ns != nil {
		x.ns.close()
	}
	if x.cg != nil {
		errs = append(errs, x.cg.remove())
	}
	errs = append(errs, x.sb.dirs.remove(x.dir))
	return errors.Join(errs...)
}

// deviceProtection says whether replicas are kept to their own GPUs'
// device nodes (devices.go).
func (sb *sandbox) deviceProtection() backend.Protection {
	p := backend.Protection{Name: backend.ProtectionDevices}
	d := sb.devices
	how := "the cgroup v1 devices controller"
	if d.mode == devicesBPF {
		how = "a BPF device program on each replica's cgroup v2"
	}
	switch {
	case d.mode == devicesOff:
		p.Detail = d.why + ": a model that unsets CUDA_VISIBLE_DEVICES can use every GPU of the box"
	case !d.applies():
		p.On = true
		p.Detail = "no NVIDIA devices on this box yet; once there are, each replica opens only its own GPUs' nodes (" + how + ")"
	default:
		p.On = true
		p.Detail = "each replica opens only its own GPUs' device nodes (and nvidiactl, nvidia-uvm), a CPU replica none, by " + how
	}
	return p
}
