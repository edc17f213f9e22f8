package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"runtime"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"inferd/internal/testenv"
	"inferd/scheduler/backend"
)

// errTimedOut is a connect that ran out of time, as net.Dialer reports one
// whose SYN was dropped by a model with a full backlog.
var errTimedOut = &net.OpError{Op: "dial", Net: "tcp", Err: timeoutError{}}

type timeoutError struct{}

func (timeoutError) Error() string   { return "i/o timeout" }
func (timeoutError) Timeout() bool   { return true }
func (timeoutError) Temporary() bool { return true }

// fakeDialClient is a Client of the echo model at ln whose connects go
// through dial, which gets the real dialer to use or not.
func fakeDialClient(t *testing.T, ln net.Listener, dial func(ctx context.Context, real dialFunc) (net.Conn, error)) *Client {
	t.Helper()
	real := (&net.Dialer{}).DialContext
	c, err := New(Config{
		Addr: ln.Addr().String(),
		Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return dial(ctx, func(ctx context.Context, network, _ string) (net.Conn, error) {
				return real(ctx, network, ln.Addr().String())
			})
		},
		Log: zerolog.New(zerolog.NewTestWriter(t)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// TestConnectThatTimesOutIsTriedAgainWithinTheDeadline: connects that time
// out (a model whose backlog is full drops them) sent nothing, so the call
// connects again, each attempt with its own timeout, and succeeds once one
// gets through; the model sees the request once.
func TestConnectThatTimesOutIsTriedAgainWithinTheDeadline(t *testing.T) {
	var requests atomic.Int64
	_, ln := serve(t, func(w http.ResponseWriter, r *http.Request) { requests.Add(1); echoHandler(w, r) })
	var attempts atomic.Int64
	var timeouts []time.Duration
	c := fakeDialClient(t, ln, func(ctx context.Context, real dialFunc) (net.Conn, error) {
		d, _ := ctx.Deadline()
		timeouts = append(timeouts, time.Until(d))
		if attempts.Add(1) <= 3 {
			return nil, errTimedOut
		}
		return real(ctx, "tcp", "")
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	out, err := c.Infer(ctx, backend.Request{Inputs: json.RawMessage(`{"n":1}`)})
	if err != nil || string(out) != `{"n":1}` {
		t.Fatalf("Infer after 3 connects timed out = %s, %v; want the echo", out, err)
	}
	if n := attempts.Load(); n != 4 {
		t.Errorf("%d connect attempts, want 4", n)
	}
	if n := requests.Load(); n != 1 {
		t.Errorf("the model saw %d requests, want 1", n)
	}
	for i, d := range timeouts {
		if want := attemptTimeouts[min(i, len(attemptTimeouts)-1)]; d > want || d < want/2 {
			t.Errorf("attempt %d had %v to connect, want about %v", i, d, want)
		}
	}
}

// TestConnectRetriesEndAtTheCallsDeadline: a model that never accepts
// fails the call with the connect's error once the call's deadline passes,
// not before and not much after.
func TestConnectRetriesEndAtTheCallsDeadline(t *testing.T) {
	_, ln := serve(t, echoHandler)
	var attempts atomic.Int64
	c := fakeDialClient(t, ln, func(ctx context.Context, _ dialFunc) (net.Conn, error) {
		attempts.Add(1)
		<-ctx.Done() // the SYN is never answered
		return nil, errTimedOut
	})
	// A second on a quiet machine: past the 100 ms and 250 ms attempts,
	// within the third's 1 s. Stretched on a busy one, where the first two
	// can take longer than they are given; more attempts then fit, not fewer.
	deadline := testenv.Scale(time.Second)
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	_, err := c.Infer(ctx, backend.Request{Inputs: json.RawMessage(`{}`)})
	if err == nil {
		t.Fatal("Infer to a model that never accepts succeeded")
	}
	if ctx.Err() == nil {
		t.Errorf("Infer gave up before the call's deadline: %v", err)
	}
	if n := attempts.Load(); n < 3 {
		t.Errorf("%d connect attempts in %v, want the 100 ms and 250 ms ones and a third", n, deadline)
	}
}

// TestRefusedConnectFailsAfterAFewRetries: a refused connect (nothing
// listens: the model has exited) is tried again only refusedRetries times,
// so that the call fails at once rather than at its deadline.
func TestRefusedConnectFailsAfterAFewRetries(t *testing.T) {
	_, ln := serve(t, echoHandler)
	var attempts atomic.Int64
	c := fakeDialClient(t, ln, func(context.Context, dialFunc) (net.Conn, error) {
		attempts.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	start := time.Now()
	_, err := c.Infer(ctx, backend.Request{Inputs: json.RawMessage(`{}`)})
	var te *TransportError
	if !errors.As(err, &te) || !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Infer to a refusing model = %v, want a TransportError saying refused", err)
	}
	if n := attempts.Load(); n != 1+refusedRetries {
		t.Errorf("%d connect attempts, want %d", n, 1+refusedRetries)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the refused call took %v to fail", d)
	}
}

// TestPoolDialsAtMostMaxDialingAtOnce: ten calls at once to a model with
// no idle connection open no more than maxDialing connects at a time; the
// rest wait, and take a connection that comes back or a dial slot that
// frees up, and all succeed.
func TestPoolDialsAtMostMaxDialingAtOnce(t *testing.T) {
	_, ln := serve(t, echoHandler)
	gate := make(chan struct{})
	var inFlight, most atomic.Int64
	c := fakeDialClient(t, ln, func(ctx context.Context, real dialFunc) (net.Conn, error) {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		<-gate
		return real(ctx, "tcp", "")
	})
	const calls = 10
	var wg sync.WaitGroup
	errs := make([]error, calls)
	for i := range calls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, errs[i] = c.Infer(ctx, backend.Request{Inputs: json.RawMessage(`{}`)})
		}()
	}
	// Wait until every call is dialing or waiting for its turn.
	deadline := time.Now().Add(30 * time.Second)
	for {
		c.conns.mu.Lock()
		dialing, waiting := c.conns.dialing, c.conns.waiting
		c.conns.mu.Unlock()
		if dialing+waiting == calls {
			if dialing != maxDialing {
				t.Errorf("%d connects under way for %d calls, want %d", dialing, calls, maxDialing)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the calls never all reached the pool: %d dialing, %d waiting", dialing, waiting)
		}
		runtime.Gosched()
	}
	close(gate)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("call %d: %v", i, err)
		}
	}
	if m := most.Load(); m > maxDialing {
		t.Errorf("%d connects were under way at once, want at most %d", m, maxDialing)
	}
}

// TestHealthCheckOfAModelNotListeningYetAnswersAtOnce: a refused connect
// is a health check's answer (the boot watch asks again), not retried.
func TestHealthCheckOfAModelNotListeningYetAnswersAtOnce(t *testing.T) {
	_, ln := serve(t, echoHandler)
	var attempts atomic.Int64
	c := fakeDialClient(t, ln, func(context.Context, dialFunc) (net.Conn, error) {
		attempts.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}
	})
	if _, err := c.Health(context.Background()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("Health = %v, want refused", err)
	}
	if n := attempts.Load(); n != 1 {
		t.Errorf("%d connect attempts for one health check, want 1", n)
	}
}
