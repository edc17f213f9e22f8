package httpapi

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The edge's budgets are tested on an http.Server that accepts net.Pipe
// connections, run inside a testing/synctest bubble: a pipe blocks a writer
// until its reader reads (a client that does not read is exactly a reader
// that never reads, whatever the kernel's socket buffers), pipe I/O is
// durably blocking, so synctest.Wait says when the server has done all it
// can, and deadlines run on the bubble's fake clock. No test waits on a
// sleep or a poll.

// pipeListener hands the server the far ends of the pipes its clients dial.
type pipeListener struct {
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn, 1024), done: make(chan struct{})}
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr("server:80") }

// pipeAddr is an address of a pipe's end, as a TCP one is written.
type pipeAddr string

func (a pipeAddr) Network() string { return "tcp" }
func (a pipeAddr) String() string  { return string(a) }

// fromConn is a pipe's server end that says it comes from remote.
type fromConn struct {
	net.Conn
	remote net.Addr
}

func (c fromConn) RemoteAddr() net.Addr { return c.remote }

// pipeServer serves h on pipes, through a ConnLimit of max (and its
// probes' reserve) when max > 0. Call it inside a synctest bubble.
type pipeServer struct {
	t   *testing.T
	ln  *pipeListener
	lim *ConnLimit
}

func newPipeServer(t *testing.T, h http.Handler, max int) *pipeServer {
	t.Helper()
	ps := &pipeServer{t: t, ln: newPipeListener()}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: time.Minute}
	var ln net.Listener = ps.ln
	if max > 0 {
		ps.lim = NewConnLimit(max)
		srv.ConnState, srv.ConnContext = ps.lim.ConnState, ps.lim.ConnContext
		ln = ps.lim.Listener(ln)
	}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-served
		// net/http lingers before it closes a connection whose body it left
		// unread (rstAvoidanceDelay, 500 ms): the bubble's clock runs past
		// it, or its goroutine outlives the test.
		time.Sleep(time.Second)
	})
	return ps
}

// pipeClient is one client connection.
type pipeClient struct {
	t    *testing.T
	conn net.Conn
	r    *bufio.Reader
}

// dial connects from 192.0.2.1 (any port).
func (ps *pipeServer) dial() *pipeClient { return ps.dialFrom("192.0.2.1:1234") }

// dialFrom connects from the address remote.
func (ps *pipeServer) dialFrom(remote string) *pipeClient {
	client := ps.pipe(remote)
	ps.t.Cleanup(func() { client.Close() })
	return &pipeClient{t: ps.t, conn: client, r: bufio.NewReader(client)}
}

// pipe connects from the address remote and returns the client's end.
func (ps *pipeServer) pipe(remote string) net.Conn {
	client, server := net.Pipe()
	ps.ln.conns <- fromConn{Conn: server, remote: pipeAddr(remote)}
	return client
}

// get sends one GET on a connection of its own, as an http.Client does,
// and returns the status. Any goroutine may call it.
func (ps *pipeServer) get(path string) (int, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       func(context.Context, string, string) (net.Conn, error) { return ps.pipe("192.0.2.1:1234"), nil },
	}}
	resp, err := c.Get("http://inferd" + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// send writes raw in the background (a pipe's write waits for the
// server to read it): the returned channel tells when it is all read, or
// the error.
func (c *pipeClient) send(raw string) <-chan error {
	done := make(chan error, 1)
	go func() {
		_, err := io.WriteString(c.conn, raw)
		done <- err
	}()
	return done
}

// request sends a request with body (none when ""); header lines go as
// given ("Name: value"), and a Content-Length of the body unless they say
// how long it is.
func (c *pipeClient) request(method, path, body string, header ...string) <-chan error {
	var b strings.Builder
	b.WriteString(method + " " + path + " HTTP/1.1\r\nHost: inferd\r\n")
	for _, h := range header {
		b.WriteString(h + "\r\n")
	}
	if body != "" {
		b.WriteString("Content-Type: application/json\r\n")
		if given := strings.ToLower(strings.Join(header, "\n")); !strings.Contains(given, "content-length") &&
			!strings.Contains(given, "transfer-encoding") {
			b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
		}
	}
	b.WriteString("\r\n" + body)
	return c.send(b.String())
}

// response reads the next response whole.
func (c *pipeClient) response() (*http.Response, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.r, nil)
	if err != nil {
		c.t.Fatalf("reading a response: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading a response body: %v", err)
	}
	return resp, string(b)
}

// closedByServer reports whether the server has closed the connection:
// nothing more to read. Call it once the server has done what it does
// (synctest.Wait).
func (c *pipeClient) closedByServer() bool {
	_ = c.conn.SetReadDeadline(time.Now()) // the pipe answers at once: EOF, or nothing yet
	_, err := c.r.ReadByte()
	_ = c.conn.SetReadDeadline(time.Time{})
	return err == io.EOF || err == io.ErrClosedPipe
}
