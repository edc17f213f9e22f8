package httpapi

import (
	clist "container/list"
	"context"
	"net"
	"net/http"
	"sync"
	"sync/atomic"

	"inferd/httpapi/metrics"
)

// ConnLimit caps the open client connections of an http.Server. Anyone may
// open a connection (no key is needed until a request is read), so without a
// cap a flood of connections uses up the daemon's file descriptors, and the
// next replica boot fails for want of a pipe.
//
// At the cap a new connection takes the place of another that is not doing
// work for anyone, closing it (a client of it that comes back reconnects):
// first the oldest that is still sending, a request's headers or its body
// (one that sends slowly, or not at all, is the cheapest way to hold a
// connection, so it goes first), then the oldest idle between keep-alive
// requests. A connection whose request is being served (its body read, its
// answer waited for or written) is never closed for room.
//
// When every connection is being served, a new one takes one of a few
// reserved slots (ProbeSlots): it is served only /healthz, /readyz and
// /metrics, once, so that a monitor still sees the daemon while clients
// keep it busy (withEdge refuses it anything else). A reserved connection
// that has sent nothing yet makes room for the next as the others do. With
// the reserve full of connections being served too, the new one waits,
// accepted but not yet read from, until one ends, and later ones wait in
// the kernel's listen backlog. So the server never holds more than max
// connections, plus the reserve, plus the one waiting.
//
// Wrap the server's listener with Listener and set the server's ConnState to
// ConnState and its ConnContext to ConnContext. Its methods are safe for
// concurrent use.
type ConnLimit struct {
	max, reserve int

	mu       sync.Mutex
	open     int // counted against max
	reserved int // open on the reserve
	// The connections that may be closed to make room, oldest first.
	sending *clist.List   // nothing read yet, or a request's body still arriving
	idle    *clist.List   // between keep-alive requests
	probes  *clist.List   // reserved ones that have sent nothing yet
	room    chan struct{} // capacity 1: a connection closed or became closable

	shed    atomic.Int64 // connections closed to make room
	waiting atomic.Int64 // connections accepted and waiting for room
}

// ProbeSlots is the number of connections kept, beyond the cap, for the
// health and metrics probes when every other connection is being served.
const ProbeSlots = 8

// NewConnLimit returns a limit of n open connections (at least 1), plus
// ProbeSlots for the probes.
func NewConnLimit(n int) *ConnLimit {
	return &ConnLimit{max: max(n, 1), reserve: ProbeSlots,
		sending: clist.New(), idle: clist.New(), probes: clist.New(), room: make(chan struct{}, 1)}
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

// Stats returns the limit's current state, for the metrics.
func (l *ConnLimit) Stats() metrics.ConnStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return metrics.ConnStats{Open: l.open + l.reserved, Max: l.max, Sending: l.sending.Len(), Reserved: l.reserved,
		Waiting: l.waiting.Load(), Shed: l.shed.Load()}
}

// Listener returns ln with Accept bounded by the limit.
func (l *ConnLimit) Listener(ln net.Listener) net.Listener {
	return &limitListener{Listener: ln, lim: l, done: make(chan struct{})}
}

// connKey carries a connection's *limitedConn in its requests' contexts.
type connKey struct{}

// ConnContext is the http.Server hook that lets the requests of a
// connection find it (withEdge): to mark it sending while its body
// arrives, and to keep a reserved one to the probes.
func (l *ConnLimit) ConnContext(ctx context.Context, c net.Conn) context.Context {
	if lc, ok := c.(*limitedConn); ok {
		return context.WithValue(ctx, connKey{}, lc)
	}
	return ctx
}

// connOf returns the counted connection a request came on, or nil.
func connOf(ctx context.Context) *limitedConn {
	lc, _ := ctx.Value(connKey{}).(*limitedConn)
	return lc
}

// ConnState is the http.Server hook that tells the limit which connections
// are being served and which could make room.
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
	switch state {
	case http.StateNew:
		l.place(lc, lc.newList())
	case http.StateIdle:
		if lc.reserved {
			l.place(lc, l.probes) // withEdge closes it after its answer; until then
		} else {
			l.place(lc, l.idle)
		}
	default: // active (served), hijacked or closed: not to be closed for room
		l.place(lc, nil)
	}
}

// newList is where a connection that has sent nothing yet waits: the
// reserve's list or the sending one. Callers hold mu.
func (lc *limitedConn) newList() *clist.List {
	if lc.reserved {
		return lc.lim.probes
	}
	return lc.lim.sending
}

// place moves lc to the back of list, or out of every list (nil), and
// wakes an Accept waiting for room when lc became closable. Callers hold
// mu.
func (l *ConnLimit) place(lc *limitedConn, list *clist.List) {
	if lc.elem != nil {
		lc.list.Remove(lc.elem)
		lc.elem, lc.list = nil, nil
	}
	if list != nil {
		lc.elem, lc.list = list.PushBack(lc), list
		l.signal()
	}
}

// bodyArriving marks lc, whose request is being served, as sending again
// while the request's body arrives: a connection that trickles a body is
// closed for room as one that trickles its headers is. bodyArrived ends
// that once the body is in.
func (l *ConnLimit) bodyArriving(lc *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !lc.closed && !lc.reserved && lc.elem == nil {
		l.place(lc, l.sending)
	}
}

func (l *ConnLimit) bodyArrived(lc *limitedConn) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !lc.closed && lc.list == l.sending {
		l.place(lc, nil)
	}
}

// signal wakes the Accept waiting for room, if any. Callers hold mu.
func (l *ConnLimit) signal() {
	select {
	case l.room <- struct{}{}:
	default:
	}
}

// admit counts c as open once there is room: a free place under the cap,
// or one made by closing the oldest connection that is sending or idle;
// else a reserved place, or one made by closing the oldest reserved
// connection that has sent nothing; else it waits until a connection ends
// or becomes closable. It fails only when the listener is closed meanwhile.
func (l *ConnLimit) admit(c net.Conn, done <-chan struct{}) (*limitedConn, bool) {
	waited := false
	defer func() {
		if waited {
			l.waiting.Add(-1)
		}
	}()
	for {
		l.mu.Lock()
		lc, victim := l.makeRoom(c)
		l.mu.Unlock()
		if lc != nil {
			return lc, true
		}
		if victim != nil {
			l.shed.Add(1)
			victim.Conn.Close() // its reader in the server fails and lets go
			continue
		}
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

// makeRoom admits c if there is room, or picks the connection to close to
// make some (already forgotten), or neither. Callers hold mu.
func (l *ConnLimit) makeRoom(c net.Conn) (admitted, victim *limitedConn) {
	if l.open < l.max {
		l.open++
		lc := &limitedConn{Conn: c, lim: l}
		l.place(lc, l.sending) // StateNew until the server says otherwise
		return lc, nil
	}
	for _, list := range []*clist.List{l.sending, l.idle} {
		if front := list.Front(); front != nil {
			victim := front.Value.(*limitedConn)
			l.forget(victim)
			return nil, victim
		}
	}
	if l.reserved < l.reserve {
		l.reserved++
		lc := &limitedConn{Conn: c, lim: l, reserved: true}
		l.place(lc, l.probes)
		return lc, nil
	}
	if front := l.probes.Front(); front != nil {
		victim := front.Value.(*limitedConn)
		l.forget(victim)
		return nil, victim
	}
	return nil, nil
}

// forget ends lc's count, once. Callers hold mu.
func (l *ConnLimit) forget(lc *limitedConn) {
	if lc.closed {
		return
	}
	l.place(lc, nil)
	lc.closed = true
	if lc.reserved {
		l.reserved--
	} else {
		l.open--
	}
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

// limitedConn is one counted connection. elem, list and closed are guarded
// by the limit's mu; reserved is set before the connection is shared.
type limitedConn struct {
	net.Conn
	lim      *ConnLimit
	elem     *clist.Element // in list while it may be closed for room
	list     *clist.List
	closed   bool // no longer counted
	reserved bool // on the probes' reserve: served /healthz, /readyz, /metrics only
}

func (c *limitedConn) Close() error {
	err := c.Conn.Close()
	c.lim.mu.Lock()
	c.lim.forget(c)
	c.lim.mu.Unlock()
	return err
}
