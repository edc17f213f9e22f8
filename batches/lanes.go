package batches

import "sync"

// lanes are the calls that all batches of a project have in flight
// (queued or running), and their inputs' bytes: together they are held to
// half of the project's queue, in calls and in bytes, so that however many
// batches run, interactive calls find room (a batch's line that finds no
// lane waits for one, never refused). The other half is the interactive
// calls' own.
type lanes struct {
	mu   sync.Mutex
	used map[string]*laneUse // by project
}

type laneUse struct {
	calls int
	bytes int64
	// freed is closed when a lane of the project is given back, for the
	// runners waiting for one; then replaced.
	freed chan struct{}
}

// laneLimit is what a project's batches may have in flight together.
type laneLimit struct {
	calls int
	bytes int64
}

// limit is the lanes of project p's batches: twice the calls its replicas
// run at once (so that a replica finds the next line queued), at most
// maxWindow, and at most half of maxQueuedPerProject and of
// maxQueuedBytesPerProject.
func (m *Manager) limit(replicas, concurrency int) laneLimit {
	return laneLimit{
		calls: max(min(replicas*concurrency*2, maxWindow, m.cfg.MaxQueuedPerProject/2), 1),
		bytes: max(m.cfg.MaxQueuedBytesPerProject/2, 1),
	}
}

// take takes a lane of project for a call of size bytes within lim, or
// returns a channel closed once a lane is given back. A call larger than
// the bytes' limit goes alone, when the project has none in flight.
func (l *lanes) take(project string, lim laneLimit, size int64) (bool, <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.used[project]
	if u == nil {
		u = &laneUse{freed: make(chan struct{})}
		l.used[project] = u
	}
	if u.calls >= lim.calls || u.calls > 0 && u.bytes+size > lim.bytes {
		return false, u.freed
	}
	u.calls++
	u.bytes += size
	return true, nil
}

// give gives back a lane of project taken for size bytes.
func (l *lanes) give(project string, size int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.used[project]
	u.calls--
	u.bytes -= size
	close(u.freed)
	if u.calls == 0 {
		delete(l.used, project)
		return
	}
	u.freed = make(chan struct{})
}
