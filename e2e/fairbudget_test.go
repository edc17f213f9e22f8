package e2e

import (
	"fmt"
	"io"
	"strings"
	"testing"
	"time"
)

// bodyHold is a connection holding a start's body minus its last byte,
// and its answer once the daemon gives one (a refusal, or a cut).
type bodyHold struct {
	size     int // the buffer the daemon holds for it
	answer   chan string
	answered bool
	text     string
}

// settled reports, without waiting, whether the daemon has answered h.
func (h *bodyHold) settled() bool {
	if !h.answered {
		select {
		case h.text = <-h.answer:
			h.answered = true
		default:
		}
	}
	return h.answered
}

// bodyHolder fills a daemon's limits.bodyBytes with held bodies from
// several addresses, as issue 41's keyless attacker did.
type bodyHolder struct {
	t     *testing.T
	d     *daemon
	addr  string
	holds []*bodyHold
}

// hold opens a connection from local that sends a start announcing size-1
// bytes and all of them but the last (so the daemon's buffer is size
// bytes: its presize for up to 64 KiB, its last growth above), and waits
// until the daemon either answers it or holds it: the bytes it counts are
// those of the holds it has not answered.
func (b *bodyHolder) hold(local string, size int) *bodyHold {
	c := dialFrom(b.t, local, b.addr)
	h := &bodyHold{size: size, answer: make(chan string, 1)}
	head := fmt.Sprintf("POST /start/v4 HTTP/1.1\r\nHost: inferd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n", size-1)
	go func() { _, _ = io.WriteString(c, head+strings.Repeat("x", size-2)) }() // blocks while nobody reads
	go func() {
		_, text, err := readAnswer(c)
		if err != nil {
			text = "no answer: " + err.Error()
		}
		h.answer <- text
	}()
	b.holds = append(b.holds, h)
	eventually(b.t, time.Minute, "the daemon to hold or answer a body", func() bool {
		if h.settled() {
			return true
		}
		held := 0
		for _, o := range b.holds {
			if !o.settled() {
				held += o.size
			}
		}
		return scrapeMetrics(b.t, b.d.base)["inferd_request_body_bytes"] == float64(held)
	})
	return h
}

// fill holds bodies from the addresses given, largest first, until no
// more of any size is held: the budget is then full to within the
// smallest (16 bytes), less than any start takes.
func (b *bodyHolder) fill(addrs []string, largest int) {
	for size := largest; size >= 16; size /= 16 {
		for refused := 0; refused < len(addrs); {
			if h := b.hold(addrs[len(b.holds)%len(addrs)], size); h.settled() {
				refused++
			} else {
				refused = 0
			}
		}
	}
}

// TestKeyedStartsGetThroughWhileKeylessAddressesHoldTheBodyBudget: three
// addresses with no key fill limits.bodyBytes with held bodies (issue 41:
// then 9 of 10 of another client's small starts were refused "server busy
// (limits.bodyBytes)"); refilled before each, every one of a keyed
// client's starts from a fourth address succeeds: it is within its share
// of the budget and cuts a body of the largest holder over its share, which
// is answered naming the budget.
func TestKeyedStartsGetThroughWhileKeylessAddressesHoldTheBodyBudget(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	const max = 1 << 20
	dir, cfg := newDaemonDir(t, fmt.Sprintf("maxBodyBytes: %d\nlimits:\n  bodyBytes: %d\n  bodyBytesPerSource: %d\n  bodyReadTimeout: 5m\n", max, 3*max, 2*max))
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, marker(), ""))
	holder := &bodyHolder{t: t, d: d, addr: strings.TrimPrefix(d.base, "http://")}
	attackers := []string{"127.0.0.50", "127.0.0.51", "127.0.0.52"}

	const starts = 10
	ok := 0
	for i := range starts {
		holder.fill(attackers, max)
		if got := scrapeMetrics(t, d.base)["inferd_request_body_bytes"]; got < 3*max-16 {
			t.Fatalf("start %d: the attackers hold %v bytes, not the budget's %d", i, got, 3*max)
		}
		c := dialFrom(t, "127.0.0.60", holder.addr)
		body := fmt.Sprintf(`{"apiKey": %q, "modelKey": "mk-echo", "modelInputs": {"n": %d}}`, key, i)
		fmt.Fprintf(c, "POST /start/v4 HTTP/1.1\r\nHost: inferd\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body)
		_, answer, err := readAnswer(c)
		if err == nil && strings.Contains(answer, `"message":"success"`) {
			ok++
		} else {
			t.Errorf("keyed start %d beside the held bodies: %v %.300s", i, err, answer)
		}
	}
	cut := 0
	for _, h := range holder.holds {
		if h.settled() && strings.Contains(h.text, "held more than its share (limits.bodyBytes)") {
			cut++
		}
	}
	if cut < 1 {
		t.Errorf("no held body was cut for the keyed starts")
	}
	report(t, "3 keyless addresses filling limits.bodyBytes (3 MiB) before each: %d of %d keyed starts succeeded; %d held bodies cut (for the keyed starts, and attackers' for each other)",
		ok, starts, cut)
}
