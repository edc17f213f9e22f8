package protocol

import (
	"io"
	"time"
)

// An OpenAI server's stream ends at data: [DONE], and its reader
// (readEventStream) stops there; the server may end the chunked body
// itself later, in a write of its own (uvicorn does), or not at once.
// Until that end has been read, the connection still carries this reply:
// a request sent on it would read the body's last chunk ("0") as its own
// answer, fail (malformed HTTP response "0") after the model had been sent
// it, and be sent again by the client. So a connection goes back to the
// pool only once its reply's body has been read to its end (bodyEnd tells
// finish whether it was), and one whose reader stopped early is drained
// first, away from the call, which has its answer and does not wait.

const (
	// drainBytes is the most of a body that drain reads after its reader
	// stopped: the chunked body's end is 5 bytes; a server that sends more
	// after [DONE] has its connection closed, not pooled.
	drainBytes = 4 << 10
	// drainTimeout is how long drain waits for a body's end: as long as an
	// idle connection is kept, which is what a connection being drained
	// is to the calls. A server that never ends its body costs a
	// connection and a goroutine this long at most.
	drainTimeout = idleConnTimeout
)

// bodyEnd is a reply's body as its reader reads it, noting whether the read
// reached its end.
type bodyEnd struct {
	r   io.ReadCloser
	eof bool
}

func (b *bodyEnd) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		b.eof = true
	}
	return n, err
}

func (b *bodyEnd) Close() error { return b.r.Close() }

// drain reads the rest of pc's reply body in a goroutine of the pool's and
// pools pc once the body has ended; a body over drainBytes, one that does
// not end within drainTimeout, a read that fails, or the pool's close close
// pc instead.
func (p *connPool) drain(pc *poolConn) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		pc.conn.Close()
		return
	}
	if p.draining == nil {
		p.draining = map[*poolConn]struct{}{}
	}
	p.draining[pc] = struct{}{}
	p.drains.Add(1)
	p.mu.Unlock()
	go func() {
		defer p.drains.Done()
		pc.conn.SetReadDeadline(time.Now().Add(drainTimeout))
		_, err := io.Copy(io.Discard, io.LimitReader(&pc.body, drainBytes))
		p.mu.Lock()
		delete(p.draining, pc)
		p.mu.Unlock()
		// Stopped by the limit, the body has not reached its end either.
		if err != nil || !pc.body.eof || pc.conn.SetReadDeadline(time.Time{}) != nil {
			pc.conn.Close()
			return
		}
		p.put(pc)
	}()
}
