package httpapi

import (
	"fmt"
	"io"
	"net"
	"net/http"
	"sync/atomic"
	"testing"
	"time"
)

// limitedServer serves h on a loopback port through a ConnLimit of n.
func limitedServer(t *testing.T, n int, h http.Handler) (*ConnLimit, string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	lim := NewConnLimit(n)
	lim.reserve = 0 // the probes' reserve has tests of its own (conns_edge_test.go)
	srv := &http.Server{Handler: h, ConnState: lim.ConnState, ReadHeaderTimeout: time.Minute}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(lim.Listener(ln))
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
	return lim, ln.Addr().String()
}

// waitUntil polls cond, which reads state another goroutine changes, for up
// to 10 s.
func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func get(addr, path string) (int, error) {
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + path)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	return resp.StatusCode, nil
}

// TestConnLimitClosesSilentConnectionsToMakeRoom: a flood of connections
// that never send a byte stays within the cap (the oldest are closed as new
// ones come), and a real request still gets through.
func TestConnLimitClosesSilentConnectionsToMakeRoom(t *testing.T) {
	lim, addr := limitedServer(t, 3, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "ok")
	}))
	var flood []net.Conn
	for range 10 {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		flood = append(flood, c)
	}
	waitUntil(t, "7 silent connections closed for room", func() bool { return lim.Stats().Shed == 7 })
	if st := lim.Stats(); st.Open != 3 || st.Max != 3 {
		t.Errorf("stats = %+v, want 3 open of 3", st)
	}
	// The oldest were closed by the server.
	_ = flood[0].SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := flood[0].Read(make([]byte, 1)); err == nil {
		t.Error("the oldest silent connection is still open")
	}
	if status, err := get(addr, "/healthz"); err != nil || status != 200 {
		t.Fatalf("a request over a flood of silent connections: %d %v", status, err)
	}
	if st := lim.Stats(); st.Open > 3 {
		t.Errorf("%d connections open, over the cap of 3", st.Open)
	}
}

// TestConnLimitMakesANewConnectionWaitWhileAllServeRequests: connections in
// the middle of a request are never closed for room; a new connection waits
// until one of them ends, then is served.
func TestConnLimitMakesANewConnectionWaitWhileAllServeRequests(t *testing.T) {
	var entered atomic.Int64
	release := make(chan struct{})
	lim, addr := limitedServer(t, 2, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		entered.Add(1)
		if r.URL.Path == "/block" {
			<-release
		}
		fmt.Fprint(w, "ok")
	}))
	blocked := make(chan error, 2)
	for range 2 {
		go func() {
			_, err := get(addr, "/block")
			blocked <- err
		}()
	}
	waitUntil(t, "two requests in the handler", func() bool { return entered.Load() == 2 })

	third := make(chan error, 1)
	go func() {
		status, err := get(addr, "/fast")
		if err == nil && status != 200 {
			err = fmt.Errorf("status %d", status)
		}
		third <- err
	}()
	waitUntil(t, "the third connection waiting for room", func() bool { return lim.Stats().Waiting == 1 })
	if n := entered.Load(); n != 2 {
		t.Fatalf("%d requests reached the handler while the cap of 2 was busy", n)
	}
	if st := lim.Stats(); st.Open != 2 || st.Shed != 0 {
		t.Errorf("stats = %+v, want 2 open and none closed for room", st)
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
	if st := lim.Stats(); st.Shed != 0 || st.Waiting != 0 {
		t.Errorf("stats = %+v, want none closed for room and none waiting", st)
	}
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
