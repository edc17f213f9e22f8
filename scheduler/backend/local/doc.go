// Package local is the local-process replica backend: it runs each replica as an
// OS process group on this machine, in a box of its own (a uid of its project's,
// a cgroup, a network, PID and mount namespace, a private HOME and tmp dirs),
// keeps its logs, and cleans up after a daemon that died without stopping its
// replicas.
//
// The scheduler reaches it only through backend.Backend: [Backend.Launch] starts a
// replica from a backend.Spec and returns the [Process] that owns it. Talking to the
// model (health checks, calls, the potassium wire format) is package protocol's;
// this package hands it the address and the dialer. The package is written around
// one promise from the design: no model process outlives the daemon, and killing a
// replica kills its whole tree.
//
// # Process model
//
// Each replica is the leader of its own process group (Setpgid), so everything the
// model forks (tokenizer workers, shell wrappers, a stray "sleep") can be signalled at
// once with kill(-pgid). Stop sends SIGTERM to the group, waits the grace period, then
// SIGKILL. When the leader exits for any reason, the group is SIGKILLed as well, so a
// leaked grandchild cannot keep GPU memory or the log pipe.
//
// The leader is the replica's init (replicainit.go): inferd's own binary run
// again under another name, which sets up the rest of the box from inside and
// starts the model, as its child (in a PID namespace, where the init is
// process 1 and the model stays in its process group) or in its place
// (without one). initcmd.go is the daemon's side: the command, the
// configuration it hands over, and the model's exit status it gets back.
//
// # The box
//
// Where the daemon may (root, or the packaged service's delegated cgroup and
// capabilities), each replica gets what sandbox.go sets up (see docs/security.md):
// identity.go runs it under a uid of its project's own with a private HOME and
// TMPDIR; cgroup.go starts it inside a cgroup of its own (CgroupFD, so there is no
// moment it runs outside), kills that whole cgroup when the replica ends, and
// enforces memoryMiB and pidsMax; netns.go gives it a network namespace with only
// loopback, which inferd dials into; the init gives it a PID namespace with its
// own /proc and a mount namespace with its own tmpfs on /tmp, /var/tmp and
// /dev/shm, drops the capabilities an exec would hand on, sets no new
// privileges and installs the seccomp filter against user namespaces
// (seccomp.go); privatefiles.go keeps the logs closed to other users. A
// project with an image runs in the image's root instead of the host's
// (imagerun.go, replicainit/imageroot.go; docs/images.md). The thread
// that forks the init is locked to it, enters the box first (the network
// namespace, v1 cgroups) and is never given back to the Go runtime: it dies with
// its goroutine. What the daemon may not do it skips, and Protections says so.
//
// If the daemon itself dies, three mechanisms clean up:
//
//   - Pdeathsig SIGKILL: the kernel kills the leader when its parent *thread* exits. The
//     child is therefore started from a goroutine locked to its OS thread
//     (runtime.LockOSThread) that stays locked until the child has exited; otherwise the
//     Go runtime could retire that thread and kill a healthy model. In a PID
//     namespace the leader is the namespace's init, and the kernel then kills
//     everything in the namespace: nothing of the replica outlives the daemon.
//   - Cgroups: the next daemon on the same data dir finds its predecessor's replica
//     cgroups (they are named after the run dir) and [Backend.Recover], which the
//     scheduler calls at start, kills each whole and removes it.
//   - Orphan cleanup, for replicas that had neither a cgroup nor a PID
//     namespace: Pdeathsig reaches only the leader, not its children. While a replica runs, RunDir/<ID>.pid records its pid
//     and process group; Recover kills every recorded group that still exists. A
//     group is only killed when one of its members carries INFERD_REPLICA_ID=<ID> in
//     /proc/<pid>/environ, so a recycled pid is never hit.
//
// # Environment
//
// The model gets a minimal environment: an allowlist from the daemon's own (PATH, HOME,
// USER, LOGNAME, LANG, LC_ALL, LC_CTYPE, TZ, TMPDIR, and pyenv's PYENV_ROOT and
// PYENV_VERSION) plus Config.PassEnv (replica.passEnv: LD_LIBRARY_PATH by default,
// which CUDA may need), HOME and TMPDIR set to its private directory, then the
// project's env, then the variables inferd owns: HOST, PORT, CUDA_VISIBLE_DEVICES,
// NVIDIA_VISIBLE_DEVICES, INFERD_PROJECT_ID and INFERD_REPLICA_ID. The daemon's
// configuration and keys (INFERD_* and anything else) never reach model code, which
// is the project owner's and not ours to trust.
//
// # Ports
//
// A replica in a network namespace of its own listens on port 8000 there (modelPort),
// as Potassium apps do anyway. On the host's network each replica listens on a
// loopback port of its own, handed out by the Backend's port allocator, which never
// gives a port to two live replicas (see ports.go); Potassium apps, which all ask for
// port 8000, are then redirected to theirs by a start-up shim (see potassium.go).
//
// # Readiness and boot diagnosis
//
// The readiness poller explains each failed health check (bootcheck.go): the
// health answer, a timeout, or, for a refused connection, the TCP ports the
// replica's process group listens on (its sockets in /proc/PID/fd, matched
// against the member's own /proc/PID/net/tcp, so its network namespace). A
// model that listens on another port than $PORT, or whose health path answers
// 404 or 405, for 2 s is stopped at once; Process.BootProblem says why. Before
// a model runs, [Checker] (check.go) says what would keep it from starting:
// apply and doctor use it.
//
// # Logs and goroutines
//
// stdout and stderr share one pipe, copied to a size-capped log file,
// LogDir/<team>/<project>/<replica>.log, with LogKeep old generations (".1", the
// newest, to ".N"; see logread.go, which also reads them back as backend.Logs, with
// terminal controls escaped: logescape.go); the last non-empty line is kept in
// memory for error messages. Per process there are
// three goroutines: the locked one that starts and waits for the child, the log
// copier and the readiness poller. All of them have ended by the time Exited is
// closed. A project's logs, all replicas' and generations together, stay under
// LogMaxBytesPerProject (logbudget.go). Logs are 0600 in 0700 directories
// (privatefiles.go).
package local
