package scheduler

import "fmt"

// DefaultMaxQueuedBytes is the default of
// Config.MaxQueuedBytesPerProject: 1 GiB of inputs waiting per project.
// Queued inputs live in the store, not in memory, so the bound is there so
// that a full disk is never the first limit a client meets, and one project
// cannot fill it for the others.
const DefaultMaxQueuedBytes = 1 << 30

// admitBytes refuses a call whose inputs of size bytes would take project
// p's queued bytes over the cap. The queue counts them (fifo.bytes, kept as
// calls are pushed and leave); the team's queuedBytes quota sums those of
// its projects (admitTeam, tenancy.go).
func (s *Scheduler) admitBytes(p *project, size int64) error {
	if waiting := p.queue.bytes(); waiting+size > s.cfg.MaxQueuedBytesPerProject && waiting > 0 {
		return &queueBytesFullError{waiting: waiting}
	}
	return nil
}

// queueBytesFullError says how many bytes wait, e.g.
// "queue full (1073741824 bytes waiting); retry later".
type queueBytesFullError struct{ waiting int64 }

func (e *queueBytesFullError) Error() string {
	return fmt.Sprintf("queue full (%d bytes waiting); retry later", e.waiting)
}

func (e *queueBytesFullError) Unwrap() error { return ErrQueueFull }
