package httpapi

import (
	clist "container/list"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
)

// ConnLimit caps the open client connections of an http.Server. Anyone may
// open a connection (no key is needed until a request is read), so without a
// cap a flood of idle connections uses up the daemon's file descriptors, and
// the next replica boot fails for want of a pipe.
//
// At the cap a new connection takes the place of the oldest connection that
// is not serving a request: one idle between keep-alive requests, or one
// that has not sent a byte since it was opened. Such a connection is closed;
// a client of it that comes back reconnects. When every connection is serving
// a request, the new one waits, accepted but not yet read from, until one
// ends, and later ones wait in the kernel's listen backlog. So the server
// never holds more than max connections, plus the one waiting.
//
// Wrap the server's listener with Listener and set the server's ConnState to
// ConnState. Its methods are safe for concurrent use.
type ConnLimit struct {
	max int

	mu   sync.Mutex
	open int
	// spare lists the connections that may be closed to make room, oldest
	// first: those in StateNew (nothing read yet) and StateIdle.
	spare *clist.List
	room  chan struct{} // capacity 1: a connection closed or fell idle

	shed    atomic.Int64 // connections closed to make room
	waiting atomic.Int64 // connections accepted and waiting for room
}

// NewConnLimit returns a limit of n open connections (at least 1).
func NewConnLimit(n int) *ConnLimit {
	return &ConnLimit{max: max(n, 1), spare: clist.New(), room: make(chan struct{}, 1)}
}

// DefaultMaxConnections sizes the cap from the process's open-file limit:
// what is left after a reserve of a quarter of the limit, at least 256 (or
// half of a smaller limit), for what else holds descriptors: the data file,
// the admin socket and its clients, replica logs, pipes and model
// connections, GPU and cgroup handles.
func DefaultMaxConnections(fileLimit uint64) int {
	fileLimit = min(fileLimit, 1<<30) // "unlimited" is not a count
	reserve := max(fileLimit/4, min(256, fileLimit/2))
	return int(max(fileLimit-reserve, 1))
}

// ConnStats is the state of a ConnLimit, for the metrics.
type ConnStats struct {
	Open, Max int
	Waiting   int64 // accepted, waiting for room: 0 or 1
	Shed      int64 // closed to make room, since start
}

// Stats returns the limit's current state.
func (l *ConnLimit) Stats() ConnStats {
	l.mu.Lock()
	open := l.open
	l.mu.Unlock()
	return ConnStats{Open: open, Max: l.max, Waiting: l.waiting.Load(), Shed: l.shed.Load()}
}

// Listener returns ln with Accept bounded by the limit.
func (l *ConnLimit) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, lim: l, done: make(chan struct{})}
}

// ConnState is the http.Server hook that tells the limit which connections
// are serving a request and which could make room.
func (l *ConnLimit) ConnState(c net.Conn, state http.ConnState) {
	lc, ok := c.(*limitedConn)
	if !ok {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if lc.closed {
		return
	}
	if lc.elem != nil {
		l.spare.Remove(lc.elem)
		lc.elem = nil
	}
	switch state {
	case http.StateNew, http.StateIdle:
		lc.elem = l.spare.PushBack(lc)
		l.signal()
	}
}

// signal wakes the Accept waiting for room, if any. Callers hold mu.
func (l *ConnLimit) signal() {
	select {
	case l.room <- struct{}{}:
	default:
	}
}

// admit counts c as open once there is room, closing the oldest spare
// connection if that makes room, or waiting until a connection ends or falls
// idle. It fails only when the listener is closed meanwhile.
func (l *ConnLimit) admit(c net.Conn, done <-chan struct{}) (*limitedConn, bool) {
	waited := false
	defer func() {
		if waited {
			l.waiting.Add(-1)
		}
	}()
	for {
		l.mu.Lock()
		if l.open < l.max {
			l.open++
			lc := &limitedConn{Conn: c, lim: l}
			lc.elem = l.spare.PushBack(lc) // StateNew until the server says otherwise
			l.mu.Unlock()
			return lc, true
		}
		if front := l.spare.Front(); front != nil {
			victim := front.Value.(*limitedConn)
			l.forget(victim)
			l.mu.Unlock()
			l.shed.Add(1)
			victim.Conn.Close() // its reader in the server fails and lets go
			continue
		}
		l.mu.Unlock()
		if !waited {
			waited = true
			l.waiting.Add(1)
		}
		select {
		case <-l.room:
		case <-done:
			return nil, false
		}
	}
}

// forget ends lc's count, once. Callers hold mu.
func (l *ConnLimit) forget(lc *limitedConn) {
	if lc.closed {
		return
	}
	if lc.elem != nil {
		l.spare.Remove(lc.elem)
		lc.elem = nil
	}
	lc.closed = true
	l.open--
	l.signal()
}

type limitListener struct {
	net.Listener
	lim       *ConnLimit
	done      chan struct{} // closed by Close: ends a wait for room
	closeOnce sync.Once
}

func (ln *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := ln.Listener.Accept()
		if err != nil {
			return nil, err
		}
		if lc, ok := ln.lim.admit(c, ln.done); ok {
			return lc, nil
		}
		c.Close()
	}
}

func (ln *limitListener) Close() error {
	ln.closeOnce.Do(func() { close(ln.done) })
	return ln.Listener.Close()
}

// limitedConn is one counted connection. elem and closed are guarded by the
// limit's mu.
type limitedConn struct {
	net.Conn
	lim    *ConnLimit
	elem   *clist.Element // in lim.spare while it may be closed for room
	closed bool           // no longer counted
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.lim.mu.Lock()
	c.lim.forget(c)
	c.lim.mu.Unlock()
	return err
}
