package local

import (
	"context"
	"time"
)

// readyAttemptTimeout bounds one health check.
const readyAttemptTimeout = time.Second

// defaultReadyIntervals are the pauses between health checks after a start or after
// the model last wrote output; the last one repeats. A model is often listening
// within a few milliseconds of its first line, so the first checks come quickly and
// then back off to a steady pace: at most 100 refused loopback connects a second
// while a model loads, and about 1 ms of detection delay for a model that is up at
// once.
var defaultReadyIntervals = []time.Duration{
	1 * time.Millisecond,
	2 * time.Millisecond,
	5 * time.Millisecond,
	10 * time.Millisecond,
}

// pollReady checks the model's health until it answers 2xx, then closes ready. It
// checks at once, then after each of the backend's readyIntervals, and again as soon
// as the model writes to stdout or stderr (most servers print a line once they
// listen), which also starts the intervals over. It gives up when ctx ends (the
// process exited) or Stop is called. The boot deadline is the scheduler's, not ours.
func (p *Process) pollReady(ctx context.Context) {
	intervals := p.b.readyIntervals
	next := 0
	t := time.NewTimer(intervals[0])
	defer t.Stop()
	for {
		if p.healthy(ctx) {
			close(p.ready)
			return
		}
		t.Reset(intervals[min(next, len(intervals)-1)])
		next++
		select {
		case <-ctx.Done():
			return
		case <-p.stopping:
			return
		case <-p.output:
			next = 0
		case <-t.C:
		}
	}
}

// healthy makes one health check.
func (p *Process) healthy(ctx context.Context) bool {
	ctx, cancel := context.WithTimeout(ctx, readyAttemptTimeout)
	defer cancel()
	return p.client.Healthy(ctx)
}
