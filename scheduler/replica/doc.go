// Package replica runs one model server as an OS process and talks to it.
//
// A replica is started by [Start] from a [Spec] and owned by the scheduler through the
// returned [Process]. The package is written around one promise from the design: no
// model process outlives the daemon, and killing a replica kills its whole tree.
//
// # Process model
//
// Each replica is the leader of its own process group (Setpgid), so everything the
// model forks (tokenizer workers, shell wrappers, a stray "sleep") can be signalled at
// once with kill(-pgid). Stop sends SIGTERM to the group, waits the grace period, then
// SIGKILL. When the leader exits for any reason, the group is SIGKILLed as well, so a
// leaked grandchild cannot keep GPU memory or the log pipe.
//
// If the daemon itself dies, two mechanisms clean up:
//
//   - Pdeathsig SIGKILL: the kernel kills the leader when its parent *thread* exits. The
//     child is therefore started from a goroutine locked to its OS thread
//     (runtime.LockOSThread) that stays locked until the child has exited; otherwise the
//     Go runtime could retire that thread and kill a healthy model.
//   - Orphan cleanup: Pdeathsig reaches only the leader, not its children. While a
//     replica runs, RunDir/<ID>.pid records its pid and process group; [KillOrphans],
//     run at daemon start, kills every recorded group that still exists. A group is
//     only killed when one of its members carries INFERD_REPLICA_ID=<ID> in
//     /proc/<pid>/environ, so a recycled pid is never hit.
//
// # Environment
//
// The model gets a minimal environment: an allowlist from the daemon's own (PATH, HOME,
// USER, LOGNAME, LANG, LC_ALL, LC_CTYPE, TZ, TMPDIR, and pyenv's PYENV_ROOT and
// PYENV_VERSION) plus Spec.PassEnv (replica.passEnv: LD_LIBRARY_PATH by default,
// which CUDA may need), then the project's env, then the variables inferd owns: PORT,
// CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES, INFERD_PROJECT_ID and
// INFERD_REPLICA_ID. The daemon's configuration and keys (INFERD_* and anything else)
// never reach model code, which is the project owner's and not ours to trust.
//
// # Logs and goroutines
//
// stdout and stderr share one pipe, copied to a size-capped log file with LogKeep old
// generations (LogPath+".1", the newest, to LogPath+".N"; see logread.go); the last non-empty line is kept in memory for error
// messages. Per process there are three goroutines: the locked one that starts and
// waits for the child, the log copier and the readiness poller. All of them have ended
// by the time Exited is closed.
package replica
