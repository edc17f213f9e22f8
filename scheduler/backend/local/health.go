package replica

import (
	"context"
	"io"
	"net/http"
	"time"
)

const (
	// readyAttemptTimeout bounds one health check.
	readyAttemptTimeout = time.Second
	// healthDrainBytes is how much of a health reply is read; a longer one closes
	// the connection.
	healthDrainBytes = 4 << 10
)

// readyIntervals are the pauses between health checks after a start or after the
// model last wrote output; the last one repeats. A model is often listening within a
// few milliseconds of its first line, so the first checks come quickly and then back
// off to a steady pace: at most 100 refused loopback connects a second while a model
// loads, and about 1 ms of detection delay for a model that is up at once. A var so a
// test can leave only the output as a trigger.
var readyIntervals = []time.Duration{
	1 * time.Millisecond,
	2 * time.Millisecond,
	5 * time.Millisecond,
	10 * time.Millisecond,
}

// pollReady checks GET HealthPath until it answers 2xx, then closes ready. It checks
// at once, then after each of readyIntervals, and again as soon as the model writes
// to stdout or stderr (most servers print a line once they listen), which also
// starts the intervals over. It gives up when ctx ends (the process exited) or Stop
// is called. The boot deadline is the scheduler's, not ours.
func (p *Process) pollReady(ctx context.Context) {
	url := p.baseURL + p.spec.HealthPath
	next := 0
	t := time.NewTimer(readyIntervals[0])
	defer t.Stop()
	for {
		if p.healthy(ctx, url) {
			close(p.ready)
			return
		}
		t.Reset(readyIntervals[min(next, len(readyIntervals)-1)])
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
func (p *Process) healthy(ctx context.Context, url string) bool {
	ctx, cancel := context.WithTimeout(ctx, readyAttemptTimeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false
	}
	// Through the pool, so that the connection the model was found ready on
	// carries its first call.
	resp, finish, err := p.conns.roundTrip(ctx, req)
	if err != nil {
		return false
	}
	// Drain a little so the connection can be reused for the next check or call.
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, healthDrainBytes))
	finish(err == nil && n < healthDrainBytes)
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}
