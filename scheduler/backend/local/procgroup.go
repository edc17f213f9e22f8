package local

// ProcessGroup returns the process group of pid, as /proc tells it. A
// replica leads its own group and the processes its model forks stay in it
// (unless they call setsid), so the scheduler uses this to tell which
// replica a GPU process belongs to. ok is false when pid has exited.
func ProcessGroup(pid int) (pgid int, ok bool) {
	pgid, state, ok := procStat(pid)
	return pgid, ok && state != 'Z'
}
