package replica

import (
	"context"
	"io"
	"net/http"
	"time"
)

const (
	// readyInterval is the pause between health checks: short, because a model that
	// is up should take calls at once, and a refused loopback connect is cheap.
	readyInterval = 10 * time.Millisecond
	// readyAttemptTimeout bounds one health check.
	readyAttemptTimeout = time.Second
)

// pollReady checks GET HealthPath until it answers 2xx, then closes ready. It gives up
// when ctx ends (the process exited) or Stop is called. The boot deadline is the
// scheduler's, not ours.
func (p *Process) pollReady(ctx context.Context) {
	url := p.baseURL + p.spec.HealthPath
	tick := time.NewTicker(readyInterval)
	defer tick.Stop()
	for {
		if p.healthy(ctx, url) {
			close(p.ready)
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-p.stopping:
			return
		case <-tick.C:
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
	resp, err := p.client.Do(req)
	if err != nil {
		return false
	}
	// Drain a little so the connection can be reused for the next check or call.
	io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
	resp.Body.Close()
	return resp.StatusCode >= 200 && resp.StatusCode < 300
}
