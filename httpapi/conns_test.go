package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The tests below serve through an in-memory listener inside a synctest
// bubble: every step of the server then blocks on channels, so
// synctest.Wait returns exactly when the server has done all it will with
// what it was given, and a test reads the limit's state then, with no
// polling and no timing.

// pipeListener hands Accept the server end of a net.Pipe per dial.
type pipeListener struct {
	conns chan net.Conn // buffered: the kernel's listen backlog
	done  chan struct{}
	once  sync.Once
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
	l.once.Do(func() { close(l.done) })
	return nil
}

func (l *pipeListener) Addr() net.Addr { return pipeAddr{} }

type pipeAddr struct{}

func (pipeAddr) Network() string { return "pipe" }
func (pipeAddr) String() string  { return "pipe" }

// dial opens a connection to the server and returns the client's end.
func (l *pipeListener) dial() net.Conn {
	client, server := net.Pipe()
	l.conns <- server
	return client
}

// get sends one request on a connection of its own and returns the status.
func (l *pipeListener) get(path string) (int, error) {
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext:       func(context.Context, string, string) (net.Conn, error) { return l.dial(), nil },
	}}
	resp, err := c.Get("http://inferd" + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// limitedServer serves h through a ConnLimit of n; stop closes the server
// and waits until it has returned. Call it inside a synctest bubble.
func limitedServer(n int, h http.Handler) (lim *ConnLimit, ln *pipeListener, stop func()) {
	ln = &pipeListener{conns: make(chan net.Conn, 16), done: make(chan struct{})}
	lim = NewConnLimit(n)
	srv := &http.Server{Handler: h, ConnState: lim.ConnState, ReadHeaderTimeout: time.Minute}
	served := make(chan struct{})
	go func() {
		defer close(served)
		_ = srv.Serve(lim.Listener(ln))
	}()
	return lim, ln, func() {
		srv.Close()
		<-served
	}
}

// TestConnLimitClosesSilentConnectionsToMakeRoom: a flood of connections
// that never send a byte stays within the cap (the oldest are closed as new
// ones come), and a real request still gets through.
func TestConnLimitClosesSilentConnectionsToMakeRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, ln, stop := limitedServer(3, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, "ok")
		}))
		defer stop()
		var flood []net.Conn
		for range 10 {
			c := ln.dial()
			defer c.Close()
			flood = append(flood, c)
		}
		synctest.Wait() // the server has taken in the whole flood
		if st := lim.Stats(); st.Shed != 7 || st.Open != 3 || st.Max != 3 {
			t.Errorf("stats = %+v, want 3 open of 3 and the 7 oldest closed for room", st)
		}
		// The oldest were closed by the server; the newest were not.
		if _, err := flood[0].Read(make([]byte, 1)); !errors.Is(err, io.EOF) {
			t.Errorf("the oldest silent connection: read %v, want EOF (closed)", err)
		}
		if status, err := ln.get("/healthz"); err != nil || status != 200 {
			t.Fatalf("a request over a flood of silent connections: %d %v", status, err)
		}
		synctest.Wait()
		if st := lim.Stats(); st.Open > 3 {
			t.Errorf("%d connections open, over the cap of 3", st.Open)
		}
	})
}

// TestConnLimitMakesANewConnectionWaitWhileAllServeRequests: connections in
// the middle of a request are never closed for room; a new connection waits
// until one of them ends, then is served.
func TestConnLimitMakesANewConnectionWaitWhileAllServeRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var entered atomic.Int64
		release := make(chan struct{})
		lim, ln, stop := limitedServer(2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered.Add(1)
			if r.URL.Path == "/block" {
				<-release
			}
			fmt.Fprint(w, "ok")
		}))
		defer stop()
		blocked := make(chan error, 2)
		for range 2 {
			go func() {
				_, err := ln.get("/block")
				blocked <- err
			}()
		}
		synctest.Wait()
		if n := entered.Load(); n != 2 {
			t.Fatalf("%d requests in the handler, want the two of the cap", n)
		}

		third := make(chan error, 1)
		go func() {
			status, err := ln.get("/fast")
			if err == nil && status != 200 {
				err = fmt.Errorf("status %d", status)
			}
			third <- err
		}()
		synctest.Wait() // the third connection is accepted and waits for room
		if n := entered.Load(); n != 2 {
			t.Fatalf("%d requests reached the handler while the cap of 2 was busy", n)
		}
		if st := lim.Stats(); st.Open != 2 || st.Shed != 0 || st.Waiting != 1 {
			t.Errorf("stats = %+v, want 2 open, none closed for room, one waiting", st)
		}
		select {
		case err := <-third:
			t.Fatalf("the third request was answered while the cap was busy: %v", err)
		default:
		}

		release <- struct{}{} // one blocked request ends; its connection closes
		if err := <-third; err != nil {
			t.Fatalf("the waiting request: %v", err)
		}
		close(release)
		for range 2 {
			if err := <-blocked; err != nil {
				t.Errorf("a blocked request: %v", err)
			}
		}
		synctest.Wait()
		if st := lim.Stats(); st.Shed != 0 || st.Waiting != 0 {
			t.Errorf("stats = %+v, want none closed for room and none waiting", st)
		}
	})
}

func TestDefaultMaxConnectionsKeepsAReserve(t *testing.T) {
	for _, tc := range []struct {
		limit uint64
		want  int
	}{
		{1 << 20, 786432}, // a quarter kept
		{65536, 49152},    // the packaged unit's LimitNOFILE
		{1024, 768},       // a shell's usual limit
		{256, 128},        // at least 256 kept, or half
		{100, 50},
		{1, 1},
	} {
		if got := DefaultMaxConnections(tc.limit); got != tc.want {
			t.Errorf("DefaultMaxConnections(%d) = %d, want %d", tc.limit, got, tc.want)
		}
	}
}
