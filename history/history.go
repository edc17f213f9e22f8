// Package history keeps the last minutes of what the box did, in memory,
// for the status page's charts: calls finished per project by outcome and
// their latency, queue depth per project, and each GPU's memory. No
// external service and no disk: a restart starts the charts empty.
//
// One goroutine (Run) owns the ring of samples. Finished calls are added
// to a small accumulator under a mutex (the scheduler's goroutine reports
// them and must never wait on anyone); at each tick Run takes the
// accumulator, reads the scheduler's queues and the GPU inventory, and
// pushes one Sample, dropping the oldest past the window. Readers ask Run
// for a copy over a channel.
package history

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"inferd/gpu"
	"inferd/scheduler"
	"inferd/store"
)

// Defaults: a sample every 5 s, 15 minutes of them.
const (
	DefaultInterval = 5 * time.Second
	DefaultWindow   = 15 * time.Minute
)

// ErrStopped is what Samples answers once Run has returned.
var ErrStopped = errors.New("history stopped")

// Sources are read at each tick. Either may be nil.
type Sources struct {
	Snapshot func() scheduler.Status // the scheduler's queues and GPU hand-outs
	GPUs     func() []gpu.Device     // the GPU inventory
}

// Sample is one interval: what finished during it, and the queues and GPU
// memory at its end. Samples are never changed once taken, so readers
// share them.
type Sample struct {
	At       time.Time         // end of the interval
	Interval time.Duration     // its length
	Projects []ProjectSample   // projects that finished or queued calls, by id
	GPUs     []gpu.Device      // the inventory at At
	Reserved map[string]uint64 // MiB inferd had handed out on each GPU, by UUID
}

// ProjectSample is one project's share of a Sample.
type ProjectSample struct {
	ID, TeamID string
	Succeeded  int // calls that finished in the interval, by outcome
	Failed     int
	Queued     int // calls waiting in its queue at the end
	// Latency holds the created-to-finished time of the interval's calls
	// that reached a replica: a call that failed before (a failed boot, a
	// full queue) says nothing about how fast the model answers.
	Latency Latencies
}

// Recorder is the history. Create it with New, start Run, feed it
// CallFinished; Samples reads it.
type Recorder struct {
	src      Sources
	interval time.Duration
	keep     int

	mu      sync.Mutex
	pending map[string]*ProjectSample // calls finished since the last tick

	reqs chan chan []Sample
	done chan struct{}
}

// New returns a Recorder that samples every interval and keeps window's
// worth of samples.
func New(src Sources, interval, window time.Duration) *Recorder {
	return &Recorder{
		src:      src,
		interval: interval,
		keep:     max(1, int(window/interval)),
		pending:  map[string]*ProjectSample{},
		reqs:     make(chan chan []Sample),
		done:     make(chan struct{}),
	}
}

// Interval is the time between samples.
func (r *Recorder) Interval() time.Duration { return r.interval }

// CallFinished counts a finished call in the current interval. It never
// blocks on Run: the scheduler's goroutine calls it.
func (r *Recorder) CallFinished(c store.Call) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p := r.pending[c.ProjectID]
	if p == nil {
		p = &ProjectSample{ID: c.ProjectID, TeamID: c.TeamID}
		r.pending[c.ProjectID] = p
	}
	if c.State == store.CallSucceeded {
		p.Succeeded++
	} else {
		p.Failed++
	}
	if !c.Dispatched.IsZero() && !c.Finished.IsZero() {
		if p.Latency == nil {
			p.Latency = Latencies{}
		}
		p.Latency.Add(c.Finished.Sub(c.Created))
	}
}

// Run samples on a ticker until ctx ends, and answers Samples. It returns
// nil when ctx ends.
func (r *Recorder) Run(ctx context.Context) error {
	defer close(r.done)
	tick := time.NewTicker(r.interval)
	defer tick.Stop()
	var ring []Sample // oldest first; at most keep
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			ring = append(ring, r.sample(now))
			if len(ring) > r.keep {
				ring = slices.Delete(ring, 0, len(ring)-r.keep)
			}
		case reply := <-r.reqs:
			reply <- slices.Clone(ring)
		}
	}
}

// Samples returns the samples kept, oldest first.
func (r *Recorder) Samples(ctx context.Context) ([]Sample, error) {
	reply := make(chan []Sample, 1)
	select {
	case r.reqs <- reply:
		return <-reply, nil // Run answers every request it takes
	case <-r.done:
		return nil, ErrStopped
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// sample takes the calls finished since the last tick and reads the queues
// and GPUs as they are now.
func (r *Recorder) sample(now time.Time) Sample {
	r.mu.Lock()
	finished := r.pending
	r.pending = map[string]*ProjectSample{}
	r.mu.Unlock()

	s := Sample{At: now, Interval: r.interval}
	if r.src.Snapshot != nil {
		st := r.src.Snapshot()
		for _, p := range st.Projects {
			if p.Queued == 0 {
				continue
			}
			ps := finished[p.ID]
			if ps == nil {
				ps = &ProjectSample{ID: p.ID, TeamID: p.TeamID}
				finished[p.ID] = ps
			}
			ps.Queued = p.Queued
		}
		s.Reserved = make(map[string]uint64, len(st.GPUs))
		for _, g := range st.GPUs {
			s.Reserved[g.UUID] = g.ReservedMiB
		}
	}
	if r.src.GPUs != nil {
		s.GPUs = r.src.GPUs()
	}
	s.Projects = make([]ProjectSample, 0, len(finished))
	for _, p := range finished {
		s.Projects = append(s.Projects, *p)
	}
	slices.SortFunc(s.Projects, func(a, b ProjectSample) int {
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	return s
}
