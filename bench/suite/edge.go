package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"inferd/bench/payload"
)

// The edge's budgets at the scale of issue 27's reproductions, with the
// default config: what no caller, with a key or without, makes the daemon
// hold (docs/security.md, "Budgets"). Before the budgets, held bodies took
// the daemon from 167 MiB to 3.26 GB, silent streams to 2.3 GB, and slow
// senders left /healthz unanswered for 20 s.
const (
	heldBodies     = 250
	heldBodySize   = 10 << 20 // maxBodyBytes' default
	silentStreams  = 30
	bigResultBytes = 60 << 20
	edgeRSSTarget  = 600 << 20
	replyRSSTarget = 400 << 20 // issue 41's target for results and replies held
	slowSenderCap  = 15200     // the reproduction's cap
	healthzProbes  = 20
	healthzTarget  = 2 * time.Second
)

// measureHeldBodies: 250 connections, each from an address of its own (so
// that the per-address budget does not hide the total), send a 10 MiB start
// minus its last byte and hold it; the daemon's peak RSS over it all.
func measureHeldBodies(ctx context.Context, e *env, o options, r *report) error {
	idle, err := payload.RSS(e.inferdPid)
	if err != nil {
		return err
	}
	if err := payload.ResetPeak(e.inferdPid); err != nil {
		return err
	}
	addr := e.base[len("http://"):]
	head := fmt.Sprintf("POST /start/v4 HTTP/1.1\r\nHost: inferd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", heldBodySize)
	body := make([]byte, heldBodySize-1)
	copy(body, `{"apiKey": "ik_nobody", "modelKey": "mk-noop", "modelInputs": {"pad": "`)
	for i := 70; i < len(body); i++ {
		body[i] = 'x'
	}
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	var wg sync.WaitGroup
	for i := range heldBodies {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(1+i))}, Timeout: 10 * time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		conns = append(conns, c)
		wg.Go(func() {
			sent := make(chan bool, 1)
			go func() {
				_, err := io.WriteString(c, head)
				if err == nil {
					_, err = c.Write(body)
				}
				sent <- err == nil
			}()
			got := make(chan bool, 1)
			go func() {
				_, err := http.ReadResponse(bufio.NewReader(c), nil)
				got <- err == nil
			}()
			// Settled: answered (refused; the daemon may close before
			// the body is all sent), or sent whole and held.
			select {
			case <-got:
			case ok := <-sent:
				if !ok {
					<-got
				}
			}
		})
	}
	wg.Wait()
	// What the held bodies cost, settled: the buffers they hold, and
	// whatever the refused ones left for the collector.
	time.Sleep(2 * time.Second)
	peak, err := payload.Peak(e.inferdPid)
	if err != nil {
		return err
	}
	inUse, err := metricSum(ctx, e.base, "inferd_request_body_bytes")
	if err != nil {
		return err
	}
	// Held, as the daemon counts them: each holds a buffer of its size and
	// a byte (a client may see its body sent whole just before a refusal).
	heldNow := int64(inUse) / (heldBodySize + 1)
	r.add(fmt.Sprintf("Peak RSS, %d connections (one address each) holding a 10 MiB start minus its last byte: %d held (%s of bodies being read, limits.bodyBytes 128 MiB), %d refused",
		heldBodies, heldNow, payload.MiB(int64(inUse)), heldBodies-heldNow),
		fmt.Sprintf("%s (idle %s, %.1f×)", payload.MiB(peak), payload.MiB(idle), float64(peak)/float64(idle)),
		"< 600 MiB (was 3.26 GB)", peak < edgeRSSTarget)
	return nil
}

// measureSilentStreams: 30 event streams of a finished call with a 60 MiB
// result, whose clients never read (a 4 KiB receive buffer); the daemon's
// peak RSS until they are cut (limits.streamWriteTimeout).
func measureSilentStreams(ctx context.Context, e *env, o options, r *report) error {
	return measureSilentReaders(ctx, e, r, "events", silentStreams, "event streams", "< 600 MiB (was 2.3 GB)", edgeRSSTarget)
}

// measureSilentResponses20 and 40: issue 41's readers of GET
// /v1/calls/ID/response that never read, 20 and 40 of one 60 MiB result
// (before they shared one copy: 1.43 GB and 2.6 GB).
func measureSilentResponses20(ctx context.Context, e *env, o options, r *report) error {
	return measureSilentReaders(ctx, e, r, "response", 20, "readers of /v1/calls/ID/response", "< 400 MiB (was 1.43 GB)", replyRSSTarget)
}

func measureSilentResponses40(ctx context.Context, e *env, o options, r *report) error {
	return measureSilentReaders(ctx, e, r, "response", 40, "readers of /v1/calls/ID/response", "< 400 MiB (was 2.6 GB)", replyRSSTarget)
}

// measureSilentReaders: n clients of GET /v1/calls/ID/<route> for a
// finished call with a 60 MiB result that never read (a 4 KiB receive
// buffer); the daemon's peak RSS until they are cut
// (limits.streamWriteTimeout).
func measureSilentReaders(ctx context.Context, e *env, r *report, route string, n int, what, want string, target int64) error {
	before, err := payload.RSS(e.inferdPid)
	if err != nil {
		return err
	}
	c := &payload.Client{Base: e.base, APIKey: e.apiKey, ModelKey: "mk-huge"}
	a, err := c.Start(ctx, []byte(`{}`), true)
	if err != nil {
		return err
	}
	for !a.Finished {
		if a, err = c.Check(ctx, a.CallID, true); err != nil {
			return err
		}
	}
	if a.Message != "success" {
		return fmt.Errorf("the 60 MiB result: %s", a.Message)
	}
	ran, err := payload.RSS(e.inferdPid)
	if err != nil {
		return err
	}
	if err := payload.ResetPeak(e.inferdPid); err != nil {
		return err
	}
	cut0, err := metricSum(ctx, e.base, `inferd_budget_refusals_total{budget="limits.streamWriteTimeout"}`)
	if err != nil {
		return err
	}
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	opened := time.Now()
	for range n {
		conn, err := d.DialContext(ctx, "tcp", e.base[len("http://"):])
		if err != nil {
			return err
		}
		defer conn.Close()
		fmt.Fprintf(conn, "GET /v1/calls/%s/%s HTTP/1.1\r\nHost: inferd\r\nX-Service-API-Key: %s\r\n\r\n", a.CallID, route, e.apiKey)
	}
	if _, err := waitMetric(ctx, e.base, `inferd_budget_refusals_total{budget="limits.streamWriteTimeout"}`, 2*time.Minute,
		func(v float64) bool { return v >= cut0+float64(n) }); err != nil {
		return err
	}
	cutAfter := time.Since(opened)
	peak, err := payload.Peak(e.inferdPid)
	if err != nil {
		return err
	}
	r.add(fmt.Sprintf("Peak RSS, %d %s of a finished call's 60 MiB result that never read, until cut (all %d after %s); RSS before the call / after it",
		n, what, n, cutAfter.Round(100*time.Millisecond)),
		fmt.Sprintf("%s (%s / %s, %.2f× after the call)", payload.MiB(peak), payload.MiB(before), payload.MiB(ran), float64(peak)/float64(ran)),
		want, peak < target)
	return nil
}

// measureHealthzUnderSlowSenders runs a daemon of its own with the
// reproduction's cap of 15,200 connections, fills it with clients that send
// their headers and one byte of a body, and keeps 5% more of them
// reconnecting as fast as the daemon closes them; /healthz is probed
// meanwhile on fresh connections.
func measureHealthzUnderSlowSenders(ctx context.Context, e *env, o options, r *report) error {
	senders := slowSenderCap + slowSenderCap/20
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < uint64(senders+1000) {
		return fmt.Errorf("needs an open-file limit of %d for its connections, have %d", senders+1000, lim.Cur)
	}
	port, err := freePort()
	if err != nil {
		return err
	}
	dir := filepath.Join(e.dir, "edge")
	cfg := filepath.Join(dir, "inferd.yaml")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	conf := fmt.Sprintf("listen: 127.0.0.1:%d\ndataDir: %s/data\nlog: {level: error, format: json}\nlimits: {maxConnections: %d}\n", port, dir, slowSenderCap)
	if err := os.WriteFile(cfg, []byte(conf), 0o644); err != nil {
		return err
	}
	p, err := start("inferd-edge", filepath.Join(dir, "inferd.log"), nil, o.inferd, "--config", cfg, "serve")
	if err != nil {
		return err
	}
	defer p.stop()
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	if err := waitHTTP(ctx, "GET", base+"/readyz", 30*time.Second); err != nil {
		return err
	}

	// The senders come from 64 addresses: one would run out of ports as
	// the daemon's closed connections linger in TIME_WAIT.
	const slowSender = "POST /start/v4 HTTP/1.1\r\nHost: inferd\r\nContent-Length: 1000\r\n\r\n{"
	stormCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer func() { stop(); wg.Wait() }()
	var reconnects atomic.Int64
	for i := range senders {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 2, byte(1+i%64))}}
		wg.Go(func() {
			for n := 0; stormCtx.Err() == nil; n++ {
				c, err := d.DialContext(stormCtx, "tcp", base[len("http://"):])
				if err != nil {
					continue // a port in TIME_WAIT, or the end
				}
				if n > 0 {
					reconnects.Add(1)
				}
				stopRead := context.AfterFunc(stormCtx, func() { c.Close() })
				io.WriteString(c, slowSender)
				_, _ = c.Read(make([]byte, 1)) // until the daemon closes it
				stopRead()
				c.Close()
			}
		})
	}
	if _, err := waitMetric(ctx, base, "inferd_connections_closed_for_room_total", 2*time.Minute,
		func(v float64) bool { return v >= float64(senders-slowSenderCap) }); err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}, Timeout: 30 * time.Second}
	var lat []time.Duration
	for range healthzProbes {
		t := time.Now()
		resp, err := client.Get(base + "/healthz")
		if err != nil {
			return fmt.Errorf("/healthz under the flood: %w", err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 {
			return fmt.Errorf("/healthz under the flood: HTTP %d", resp.StatusCode)
		}
		lat = append(lat, time.Since(t))
		time.Sleep(250 * time.Millisecond) // the probes' pace, as a monitor's
	}
	shed, _ := metricSum(ctx, base, "inferd_connections_closed_for_room_total")
	slices.Sort(lat)
	r.add(fmt.Sprintf("/healthz latency, p50 / max of %d probes, while %d slow body senders (headers and 1 byte) reconnect against a cap of %d (%.0f reconnects, %.0f closed for room)",
		healthzProbes, senders, slowSenderCap, float64(reconnects.Load()), shed),
		dur(lat[len(lat)/2])+" / "+dur(lat[len(lat)-1]), "≤ 2 s (was unanswered for 20 s)", lat[len(lat)-1] <= healthzTarget)
	return nil
}

// measureKeylessHold: issue 41's attack on the shared body budget, at the
// defaults: three addresses with no key fill limits.bodyBytes with held
// starts (each all but its last byte), 10 MiB ones first, then ever smaller
// ones down to 16 bytes, until no more of any size is held; then a keyed
// client at a fourth address makes a small start, and the attackers fill
// the budget again before each of 20. Before the budget was fair, 9 of 10
// of such starts were refused "server busy (limits.bodyBytes)".
func measureKeylessHold(ctx context.Context, e *env, o options, r *report) error {
	const starts = 20
	if err := payload.ResetPeak(e.inferdPid); err != nil {
		return err
	}
	h := &holder{ctx: ctx, base: e.base}
	defer h.close()
	c := &payload.Client{Base: e.base, APIKey: e.apiKey, ModelKey: "mk-noop"}
	ok, refused := 0, map[string]int{}
	for range starts {
		if err := h.fill([]string{"127.0.2.1", "127.0.2.2", "127.0.2.3"}, heldBodySize); err != nil {
			return err
		}
		a, err := c.Start(ctx, []byte(`{}`), false)
		switch {
		case err != nil:
			refused[err.Error()]++
		case a.Message == "success":
			ok++
		default:
			refused[a.Message]++
		}
	}
	held, err := metricSum(ctx, e.base, "inferd_request_body_bytes")
	if err != nil {
		return err
	}
	peak, err := payload.Peak(e.inferdPid)
	if err != nil {
		return err
	}
	r.add(fmt.Sprintf("Keyed starts that succeed while 3 keyless addresses fill limits.bodyBytes (128 MiB) with held starts, 10 MiB down to 16 bytes, before each (%s held at the end, %d connections opened, %d answered: refused or cut); refused: %v",
		payload.MiB(int64(held)), len(h.holds), h.answered(), refused),
		fmt.Sprintf("%d of %d", ok, starts), "all (was 1 of 10)", ok == starts)
	r.add("Peak RSS over that hold", payload.MiB(peak), "< 600 MiB", peak < edgeRSSTarget)
	return nil
}

// holder holds request bodies on connections from chosen addresses.
type holder struct {
	ctx   context.Context
	base  string
	holds []*hold
}

// hold is one held body: its buffer's size in the daemon, and whether the
// daemon has answered it (refused, or cut it for room).
type hold struct {
	conn  net.Conn
	size  int
	done  chan struct{}
	ended bool
}

func (h *hold) over() bool {
	if !h.ended {
		select {
		case <-h.done:
			h.ended = true
			h.conn.Close() // answered: its descriptor goes
		default:
		}
	}
	return h.ended
}

// open sends from local a start announcing size-1 bytes and all but its
// last (the daemon's buffer is then size bytes), and waits until the
// daemon answers it or holds it: the bytes it counts are those of the
// holds it has not answered.
func (h *holder) open(local string, size int) (*hold, error) {
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(local)}, Timeout: 10 * time.Second}
	c, err := d.DialContext(h.ctx, "tcp", h.base[len("http://"):])
	if err != nil {
		return nil, err
	}
	hd := &hold{conn: c, size: size, done: make(chan struct{})}
	h.holds = append(h.holds, hd)
	head := fmt.Sprintf("POST /start/v4 HTTP/1.1\r\nHost: inferd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size-1)
	go func() { _, _ = c.Write(append([]byte(head), bytes.Repeat([]byte("x"), size-2)...)) }()
	go func() {
		_, _ = http.ReadResponse(bufio.NewReader(c), nil)
		close(hd.done)
	}()
	deadline := time.Now().Add(time.Minute)
	for !hd.over() {
		held := 0
		for _, o := range h.holds {
			if !o.over() {
				held += o.size
			}
		}
		if v, err := metricSum(h.ctx, h.base, "inferd_request_body_bytes"); err == nil && v == float64(held) {
			break
		}
		if time.Now().After(deadline) {
			return nil, fmt.Errorf("a body of %d bytes neither held nor answered in a minute", size)
		}
		time.Sleep(5 * time.Millisecond) // a load script: no signal to wait on but the daemon's metric
	}
	return hd, nil
}

// fill holds bodies from addrs, largest first and down to 16 bytes, until
// no more of any size is held: the budget is then full to within 16 bytes.
func (h *holder) fill(addrs []string, largest int) error {
	for _, size := range []int{largest, 1 << 20, 64 << 10, 4 << 10, 256, 16} {
		for refused := 0; refused < len(addrs); {
			hd, err := h.open(addrs[len(h.holds)%len(addrs)], size)
			if err != nil {
				return err
			}
			if hd.over() {
				refused++
			} else {
				refused = 0
			}
		}
	}
	return nil
}

// answered counts the holds the daemon answered.
func (h *holder) answered() int {
	n := 0
	for _, o := range h.holds {
		if o.over() {
			n++
		}
	}
	return n
}

func (h *holder) close() {
	for _, o := range h.holds {
		o.conn.Close()
	}
}

// measureRepliesInFlight: issue 41's one project at concurrency 16 whose
// model answers each call with 60 MiB, 16 calls at once; the daemon's peak
// RSS while they run and are answered (1.55 GB before limits.replyBytes).
func measureRepliesInFlight(ctx context.Context, e *env, o options, r *report) error {
	const calls = 16
	c := &payload.Client{Base: e.base, APIKey: e.apiKey, ModelKey: "mk-huge16"}
	if _, err := c.Start(ctx, []byte(`{}`), false); err != nil { // booted
		return err
	}
	before, err := payload.RSS(e.inferdPid)
	if err != nil {
		return err
	}
	if err := payload.ResetPeak(e.inferdPid); err != nil {
		return err
	}
	// Started with startOnly, their end read from the metrics: a check's
	// answer would hold a copy of each result, which is not a reply in
	// flight (results served are GET /v1/calls/ID/response's step).
	done := `inferd_calls_total{project="huge16",outcome=`
	ended0, err := metricSum(ctx, e.base, done)
	if err != nil {
		return err
	}
	start := time.Now()
	for range calls {
		if _, err := c.Start(ctx, []byte(`{}`), true); err != nil {
			return err
		}
	}
	if _, err := waitMetric(ctx, e.base, done, 5*time.Minute, func(v float64) bool { return v >= ended0+calls }); err != nil {
		return err
	}
	took := time.Since(start)
	failed, err := metricSum(ctx, e.base, `inferd_calls_total{project="huge16",outcome="failed"}`)
	if err != nil {
		return err
	}
	peak, err := payload.Peak(e.inferdPid)
	if err != nil {
		return err
	}
	ok := calls - int64(failed)
	r.add(fmt.Sprintf("Peak RSS, %d calls at once of one project at concurrency 16 whose model replies 60 MiB each (%d succeeded, in %s; limits.replyBytes 128 MiB); RSS before",
		calls, ok, took.Round(100*time.Millisecond)),
		fmt.Sprintf("%s (%s)", payload.MiB(peak), payload.MiB(before)), "< 400 MiB (was 1.55 GB)", peak < replyRSSTarget && ok == calls)
	return nil
}
