package httpapi

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"testing/synctest"
)

// The tests below serve through pipes in a synctest bubble (pipes_test.go):
// synctest.Wait returns exactly when the server has done all it will with
// what it was given, and a test reads the limit's state then, with no
// polling and no timing.

// limitedServer serves h through a ConnLimit of n without the probes'
// reserve (which has tests of its own, conns_edge_test.go). Call it inside a
// synctest bubble.
func limitedServer(t *testing.T, n int, h http.Handler) (*ConnLimit, *pipeServer) {
	ps := newPipeServer(t, h, n)
	ps.lim.reserve = 0
	return ps.lim, ps
}

// TestConnLimitClosesSilentConnectionsToMakeRoom: a flood of connections
// that never send a byte stays within the cap (the oldest are closed as new
// ones come), and a real request still gets through.
func TestConnLimitClosesSilentConnectionsToMakeRoom(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lim, ln := limitedServer(t, 3, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, "ok")
		}))
		var flood []net.Conn
		for range 10 {
			flood = append(flood, ln.dial().conn)
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
		lim, ln := limitedServer(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			entered.Add(1)
			if r.URL.Path == "/block" {
				<-release
			}
			fmt.Fprint(w, "ok")
		}))
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
