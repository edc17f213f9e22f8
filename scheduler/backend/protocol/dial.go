package protocol

import (
	"context"
	"errors"
	"net"
	"time"
)

// Connecting to a replica. A model server accepts connections at its own
// pace, and waiting ones sit in its listen backlog: Python's http.server
// keeps 5. When the backlog is full the kernel drops a connect's SYN, and
// the client sends it again only after a second (then 3 s, 7 s ...): a model
// that declares concurrency 64 and gets 64 calls at once would see most of
// its connects stall, and with a 1 s connect timeout fail, though nothing
// was sent and the model was healthy. So the pool:
//
//   - dials at most maxDialing connections to a replica at a time; a call
//     beyond that waits for a dial to end or for a connection to come back
//     to the pool, whichever is first, so a burst opens connections as the
//     replica accepts them, and reuses those that free up meanwhile;
//   - gives a connect attemptTimeouts[i] (growing: a loopback connect takes
//     microseconds unless its SYN was dropped, and a fresh one is sent
//     sooner than the kernel's retransmission; the later ones are long
//     enough for a loaded box) and tries again, within the call's deadline:
//     a connect that failed sent nothing, so trying again is always safe
//     (a request that was sent is never sent twice, see roundTrip);
//   - tries again at most refusedRetries times after an error other than a
//     timeout (refused: nothing listens, as when the model has exited), so
//     that a call to a model that is gone still fails at once; a health
//     check not at all (a model that does not listen yet is its answer).

const (
	// maxDialing is how many connects to one replica may be under way.
	maxDialing = 4
	// refusedRetries bounds the retries after a connect was refused or reset.
	refusedRetries = 2
	// refusedBackoff is the wait before the first such retry; it doubles.
	refusedBackoff = 5 * time.Millisecond
)

// attemptTimeouts are the successive connect attempts' timeouts; the last
// repeats until the call's deadline. The longest covers the kernel's SYN
// retransmissions at 1 s and 3 s.
var attemptTimeouts = [...]time.Duration{100 * time.Millisecond, 250 * time.Millisecond, time.Second, 4 * time.Second}

// ConnectTimeout is the longest a single connect attempt may take: a
// backend's dialer may use it as its own bound.
const ConnectTimeout = 4 * time.Second

// dialRetrying connects with dial, trying again as the comment above says,
// until it succeeds, ctx ends or its retries are spent (refusedTries after
// errors other than a timeout). A ctx without a deadline gets one round of
// attemptTimeouts.
func dialRetrying(ctx context.Context, dial dialFunc, addr string, refusedTries int) (net.Conn, error) {
	_, bounded := ctx.Deadline()
	refused := 0
	for attempt := 0; ; attempt++ {
		timeout := attemptTimeouts[min(attempt, len(attemptTimeouts)-1)]
		actx, cancel := context.WithTimeout(ctx, timeout)
		conn, err := dial(actx, "tcp", addr)
		cancel()
		if err == nil {
			return conn, nil
		}
		if ctx.Err() != nil || (!bounded && attempt == len(attemptTimeouts)-1) {
			return nil, err
		}
		if !isTimeout(err) {
			if refused == refusedTries {
				return nil, err
			}
			if !sleepCtx(ctx, refusedBackoff<<refused) {
				return nil, err
			}
			refused++
		}
	}
}

// isTimeout reports whether a connect ran out of time (its SYN, or the
// SYN-ACK, was lost or dropped), as opposed to being refused.
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || (errors.As(err, &ne) && ne.Timeout())
}

// sleepCtx waits d, or less if ctx ends first; it reports whether it waited d.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
