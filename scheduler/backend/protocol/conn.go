package protocol

import (
	"bufio"
	"compress/gzip"
	"context"
	"errors"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// connPool sends Infer's requests to one replica over kept-alive connections, on
// the calling goroutine. net/http's Transport gives every connection a read and a
// write goroutine, so each call through it hands off between three goroutines and
// allocates for each; at concurrency 1 that was most of the daemon's time in the
// hop to the model. Here the caller writes the request and reads the reply itself;
// all HTTP parsing stays in net/http (Request.Write, ReadResponse), and this type
// only keeps the connections.
//
// A connection goes back to the pool only after a reply whose body was read to its
// end, that did not ask to close, and with no error or cancellation on the way. A
// reply its reader stopped at its protocol's end before its body's (an event
// stream's data: [DONE]) has the rest of its body read by drain first.
type connPool struct {
	addr   string
	dial   dialFunc
	max    int           // idle connections kept at most
	maxAge time.Duration // an idle connection older than this is closed, not reused

	mu       sync.Mutex
	idle     []*poolConn // most recently used last
	draining map[*poolConn]struct{}
	closed   bool
	drains   sync.WaitGroup // drain's goroutines
	dialing  int            // connects under way, at most maxDialing (dial.go)
	waiting  int            // gets waiting for a connection or a dial slot
	// freed, made by a get that waits for a connection or a dial slot, is
	// closed (and dropped) when either frees up: every waiter looks again.
	freed chan struct{}
}

// poolConn is one connection with its buffers.
type poolConn struct {
	conn      net.Conn
	raw       syscall.RawConn // for the liveness peek
	cw        countWriter
	lr        limitReader // between conn and br: caps a reply's headers
	br        *bufio.Reader
	bw        *bufio.Writer
	body      bodyEnd // the body of the reply being read, as the caller reads it
	idleSince time.Time
	// peek is alive's look at the socket, made once per connection (a
	// closure made per call costs an allocation every call); peekErr is
	// what its recvfrom said.
	peek    func(fd uintptr) bool
	peekErr error
}

// errHeadersTooLarge is returned by roundTrip (wrapped) when a reply's status
// line and headers go over maxHeaderBytes.
var errHeadersTooLarge = errors.New("reply headers too large")

// limitReader reads from r until n bytes have been read, then fails with
// errHeadersTooLarge. exchange sets n to maxHeaderBytes while it reads a
// reply's headers and lifts it for the body, which Infer caps itself: so a
// model cannot make the daemon buffer an endless header line. What br reads
// ahead of the headers counts too, a few KiB at most.
type limitReader struct {
	r io.Reader
	n int64
}

func (l *limitReader) Read(b []byte) (int, error) {
	if l.n <= 0 {
		return 0, errHeadersTooLarge
	}
	if int64(len(b)) > l.n {
		b = b[:l.n]
	}
	n, err := l.r.Read(b)
	l.n -= int64(n)
	return n, err
}

// noLimit is a limitReader's n while no headers are being read.
const noLimit = math.MaxInt64

// countWriter counts the bytes that reached the connection, so a failed write
// that sent nothing can be retried on another connection.
type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(b []byte) (int, error) {
	n, err := c.w.Write(b)
	c.n += int64(n)
	return n, err
}

// fastPathMaxBody is the largest request body sent through connPool. The pool
// writes the whole request before it reads the reply, so a larger body could block
// on a model that answers (say 413) without reading it, where net/http would return
// the answer; such requests, for which the per-call cost matters little, keep
// going through http.Client. Up to this size a loopback write completes into the
// socket buffers whatever the model does.
const fastPathMaxBody = 32 << 10

// max1xx is how many informational (1xx) replies are skipped before the real one,
// as net/http does.
const max1xx = 5

// aLongTimeAgo is a deadline in the past: setting it interrupts a blocked read or
// write at once.
var aLongTimeAgo = time.Unix(1, 0)

func newConnPool(addr string, dial dialFunc, max int, maxAge time.Duration) *connPool {
	return &connPool{addr: addr, dial: dial, max: max, maxAge: maxAge}
}

// poolRequest is one request through the pool, as it goes on the wire: its
// head (request line and headers, through the blank line; see requestHead)
// and its body. method and url are for reading the reply (a HEAD's has no
// body) and for errors, which name them as http.Client's do.
type poolRequest struct {
	method, url string
	head, body  []byte
	// probe: a health check, whose refused connect is its answer (the
	// model does not listen yet; the boot watch asks again), not retried.
	probe bool
}

// requestHead is the head of a request to host for target (a path with its
// query, as url.URL.RequestURI gives it), with the headers net/http's
// client sends for such a request (Request.Write), in its order, and
// extra (each "Name: value\r\n") before the blank line. A body of
// bodyLen bytes (-1: none) is announced by Content-Length; gzip is asked
// for, and undone, as the transport does (see gunzip), so that a model sees
// what it saw from net/http and the caller the same body.
func requestHead(method, host, target string, bodyLen int, contentType string, extra ...string) []byte {
	b := make([]byte, 0, 160+len(target))
	b = append(b, method...)
	b = append(b, ' ')
	b = append(b, target...)
	b = append(b, " HTTP/1.1\r\nHost: "...)
	b = append(b, host...)
	b = append(b, "\r\nUser-Agent: Go-http-client/1.1\r\n"...)
	if bodyLen >= 0 {
		b = append(b, "Content-Length: "...)
		b = strconv.AppendInt(b, int64(bodyLen), 10)
		b = append(b, "\r\n"...)
	}
	b = append(b, "Accept-Encoding: gzip\r\n"...)
	if contentType != "" {
		b = append(b, "Content-Type: "...)
		b = append(b, contentType...)
		b = append(b, "\r\n"...)
	}
	for _, h := range extra {
		b = append(b, h...)
	}
	return append(b, "\r\n"...)
}

// replyTo is what ReadResponse is told of the request a reply answers: only
// the method matters to it (a HEAD's reply has no body), so one request per
// method serves every call; nothing writes to them.
var replyTo = map[string]*http.Request{
	http.MethodGet:  {Method: http.MethodGet},
	http.MethodPost: {Method: http.MethodPost},
}

// roundTrip sends req (a body of at most fastPathMaxBody) and reads the reply's
// header. The caller reads the body, then must call finish exactly once, with
// clean set when it read the body to its end without error; finish pools or
// closes the connection. Errors are *url.Error, as http.Client's are.
func (p *connPool) roundTrip(ctx context.Context, req poolRequest) (resp *http.Response, finish func(clean bool), err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	for {
		pc, reused, err := p.get(ctx, req.probe)
		if err != nil {
			return nil, nil, &url.Error{Op: urlOp(req.method), URL: req.url, Err: err}
		}
		// A cancelled ctx interrupts the exchange by moving the deadline into the
		// past; the connection is then closed, never pooled.
		stop := context.AfterFunc(ctx, func() { pc.conn.SetDeadline(aLongTimeAgo) })
		resp, err := pc.exchange(req)
		if err != nil {
			stop()
			pc.conn.Close()
			if reused && pc.cw.n == 0 && ctx.Err() == nil {
				// Nothing reached the model on a connection it had already closed:
				// safe to send again on another, as net/http does.
				continue
			}
			return nil, nil, &url.Error{Op: urlOp(req.method), URL: req.url, Err: err}
		}
		finish := func(clean bool) {
			switch {
			case !stop() || !clean || resp.Close:
				pc.conn.Close()
			case !pc.body.eof:
				p.drain(pc)
			default:
				p.put(pc)
			}
		}
		return resp, finish, nil
	}
}

// exchange writes req and reads the reply's header, skipping 1xx replies.
func (pc *poolConn) exchange(req poolRequest) (*http.Response, error) {
	pc.cw.n = 0
	pc.bw.Write(req.head) // errors stick in bw: Flush returns them
	pc.bw.Write(req.body)
	if err := pc.bw.Flush(); err != nil {
		return nil, err
	}
	to := replyTo[req.method]
	if to == nil {
		to = &http.Request{Method: req.method}
	}
	for range max1xx + 1 {
		pc.lr.n = maxHeaderBytes
		resp, err := http.ReadResponse(pc.br, to)
		pc.lr.n = noLimit
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			if resp.StatusCode < 200 {
				resp.Close = true // the connection is not HTTP any more
			}
			pc.body = bodyEnd{r: resp.Body}
			resp.Body = &pc.body
			gunzip(resp)
			return resp, nil
		}
	}
	return nil, errors.New("too many 1xx informational responses")
}

// get returns an idle connection that is still open, or dials a new one. reused
// tells which. While maxDialing connects are under way it waits for one of
// them to end or for a connection to come back, whichever is first (dial.go).
func (p *connPool) get(ctx context.Context, probe bool) (pc *poolConn, reused bool, err error) {
	for {
		p.mu.Lock()
		if n := len(p.idle); n > 0 {
			pc = p.idle[n-1]
			p.idle[n-1] = nil
			p.idle = p.idle[:n-1]
			p.mu.Unlock()
			if time.Since(pc.idleSince) < p.maxAge && pc.alive() {
				return pc, true, nil
			}
			pc.conn.Close()
			continue
		}
		if p.dialing < maxDialing {
			p.dialing++
			p.mu.Unlock()
			break
		}
		if p.freed == nil {
			p.freed = make(chan struct{})
		}
		freed := p.freed
		p.waiting++
		p.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
		}
		p.mu.Lock()
		p.waiting--
		p.mu.Unlock()
		if err := ctx.Err(); err != nil {
			return nil, false, err
		}
	}
	refusedTries := refusedRetries
	if probe {
		refusedTries = 0
	}
	conn, err := dialRetrying(ctx, p.dial, p.addr, refusedTries)
	p.mu.Lock()
	p.dialing--
	p.wake()
	p.mu.Unlock()
	if err != nil {
		return nil, false, err
	}
	pc = &poolConn{conn: conn}
	pc.peek = pc.peekOnce
	if sc, ok := conn.(syscall.Conn); ok {
		if pc.raw, err = sc.SyscallConn(); err != nil {
			conn.Close()
			return nil, false, err
		}
	}
	pc.cw.w = conn
	pc.lr = limitReader{r: conn, n: noLimit}
	pc.br = bufio.NewReader(&pc.lr)
	pc.bw = bufio.NewWriter(&pc.cw)
	return pc, false, nil
}

// alive reports whether an idle connection can carry a request: nothing buffered,
// and a non-blocking peek at the socket finds neither data nor end of stream. This
// stands in for net/http's read goroutine, which notices a model closing an idle
// connection; without it the next call would be sent into a dead one and fail.
func (pc *poolConn) alive() bool {
	if pc.br.Buffered() > 0 || pc.raw == nil {
		return false
	}
	err := pc.raw.Read(pc.peek)
	return err == nil && (pc.peekErr == syscall.EAGAIN || pc.peekErr == syscall.EWOULDBLOCK)
}

// peekOnce is a poolConn's peek: one non-blocking MSG_PEEK of a byte.
// Data (n > 0) or end of stream (n == 0, no error) both disqualify.
func (pc *poolConn) peekOnce(fd uintptr) bool {
	var buf [1]byte
	_, _, pc.peekErr = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return true // never wait for readiness: one look is all we want
}

// put pools pc, or closes it when the pool is full or closed.
func (p *connPool) put(pc *poolConn) {
	pc.idleSince = time.Now()
	p.mu.Lock()
	if p.closed || len(p.idle) >= p.max {
		p.mu.Unlock()
		pc.conn.Close()
		return
	}
	p.idle = append(p.idle, pc)
	p.wake()
	// The least recently used connection may have outlived maxAge while load was
	// lower; close it rather than keep it until the replica exits.
	var old *poolConn
	if first := p.idle[0]; pc.idleSince.Sub(first.idleSince) > p.maxAge {
		old = first
		p.idle = append(p.idle[:0], p.idle[1:]...)
	}
	p.mu.Unlock()
	if old != nil {
		old.conn.Close()
	}
}

// wake tells the gets waiting that a connection or a dial slot freed up.
// Callers hold mu.
func (p *connPool) wake() {
	if p.freed != nil {
		close(p.freed)
		p.freed = nil
	}
}

// close closes the idle connections and those being drained, makes later puts
// close theirs, and returns once drain's goroutines have ended.
func (p *connPool) close() {
	p.mu.Lock()
	idle := p.idle
	p.idle = nil
	for pc := range p.draining {
		idle = append(idle, pc)
	}
	p.closed = true
	p.mu.Unlock()
	for _, pc := range idle {
		pc.conn.Close()
	}
	p.drains.Wait()
}

// gunzip undoes a gzip Content-Encoding the way net/http's transport does when it
// asked for it: lazily, dropping the encoding and the length.
func gunzip(resp *http.Response) {
	if !strings.EqualFold(resp.Header.Get("Content-Encoding"), "gzip") {
		return
	}
	resp.Body = &gzipReader{body: resp.Body}
	resp.Header.Del("Content-Encoding")
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	resp.Uncompressed = true
}

// gzipReader decompresses body, opening the gzip stream on the first Read.
type gzipReader struct {
	body io.ReadCloser
	zr   *gzip.Reader
	zerr error
}

func (g *gzipReader) Read(b []byte) (int, error) {
	if g.zr == nil && g.zerr == nil {
		g.zr, g.zerr = gzip.NewReader(g.body)
	}
	if g.zerr != nil {
		return 0, g.zerr
	}
	return g.zr.Read(b)
}

func (g *gzipReader) Close() error { return g.body.Close() }

// urlOp is the Op of http.Client's *url.Error for method, e.g. "Post".
func urlOp(method string) string {
	return method[:1] + strings.ToLower(method[1:])
}
