package etcd

import (
	"context"
	"errors"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// DefaultTryTimeout bounds one try of an etcd request when
// Options.TryTimeout is 0.
//
// A request caught by a raft leader change is never answered: a write
// a follower forwarded to the dead leader is lost with it, and etcd
// answers "request timed out, possibly due to previous leader failure"
// only after its own timeout (5 s plus two election timeouts). Sent again
// once etcd has elected another leader (within one to two election
// timeouts), it is answered at once. A healthy cluster answers in
// milliseconds (3 members: 1.2 ms per write, LIBRARIES.md), so a try with
// no answer after half a second is stuck, not slow: giving up on it then
// and sending it again makes a request's pause the election and at most
// half a second more, not its whole bound. Measured with three nodes, the
// one holding etcd's leader killed: a request paused 1.2-1.4 s with 500 ms
// tries, up to 2.2 s with 1 s tries (the next try starts a second after a
// lost one, whenever the election ended), 5.6 s with one 5 s try. A cluster
// so loaded that a healthy try takes longer sends requests twice (harmless,
// but more load) and fails them with store.ErrUnavailable at their bound:
// set TryTimeout higher there.
const DefaultTryTimeout = 500 * time.Millisecond

// retryPause is the wait after a failed try: one that failed at once (no
// leader, connection refused) would otherwise be sent again at once, so it
// keeps a leaderless or unreachable etcd from being hammered; it is not a
// synchronization.
const retryPause = 100 * time.Millisecond

// retry sends req, an etcd request that is harmless to send again, until
// it gets an answer or ctx (the request's whole bound) ends: each try has
// TryTimeout at most, and a try that failed for want of an answer (see
// retryable) is sent again. It returns the last try's error, and how many
// tries were sent: a write tried more than once may have been applied by a
// try whose answer was lost, so a compare of the last try may fail on the
// write's own earlier effect (see commitTxn's resent, and foundValue).
//
// A refusal (a failed compare is an answer, not an error; too large, no
// space) is never retried. Requests are retried only when sending them
// twice stores the same as sending them once: reads, puts and deletes of
// fixed keys, and compare transactions whose compares make a second apply
// change nothing (create-if-absent, a revision compare); the caller then
// tells its own earlier write from another writer's.
//
// While etcd is known to be down (see down), a request gets one try: the
// client's 503 comes within a try, not after the whole bound again.
func (s *Store) retry(ctx context.Context, req func(ctx context.Context) error) (tries int, err error) {
	return s.tries(ctx, req, false)
}

// retrying runs try, a write harmless to repeat (see retry), for up to
// RetryFor: the bound of the writes the daemon waits on to make progress
// (call writes, webhook delivery updates), longer than RequestTimeout so
// that they outlast a slow etcd election. They go on trying while etcd is
// known to be down (a result is kept if etcd comes back within RetryFor),
// except once the store is closing: then one try, so that a shutdown
// without quorum does not wait out RetryFor.
func (s *Store) retrying(try func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(context.Background(), s.retryFor)
	defer cancel()
	_, err := s.tries(ctx, try, true)
	return err
}

// tries is retry; patient requests (retrying's) keep trying while etcd is
// known to be down, until the store closes.
func (s *Store) tries(ctx context.Context, req func(ctx context.Context) error, patient bool) (tries int, err error) {
	for {
		tctx, cancel := context.WithTimeout(ctx, s.tryTO)
		err = req(tctx)
		cancel()
		tries++
		if err == nil {
			s.unanswered.Store(0)
			return tries, nil
		}
		if !retryable(err) || s.cli.Ctx().Err() != nil {
			return tries, err
		}
		s.unanswered.CompareAndSwap(0, time.Now().UnixNano())
		if s.down() && (!patient || s.closed.Load()) {
			return tries, err
		}
		pause(ctx, retryPause)
		if ctx.Err() != nil {
			return tries, err // the bound ran out: etcd is unavailable
		}
	}
}

// down reports whether etcd is known to be down: no try has been answered
// for a request's whole bound (RequestTimeout), longer than an etcd
// election lasts, so quorum is lost or this node is cut off from it. Any
// try answered ends it.
func (s *Store) down() bool {
	since := s.unanswered.Load()
	return since != 0 && time.Since(time.Unix(0, since)) >= s.reqTO
}

// rangeOf is a Get retried within ctx (see retry).
func (s *Store) rangeOf(ctx context.Context, key string, opts ...clientv3.OpOption) (*clientv3.GetResponse, error) {
	var resp *clientv3.GetResponse
	_, err := s.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = s.cli.Get(ctx, key, opts...)
		return err
	})
	return resp, err
}

// commitTxn commits the transaction txn builds, retried within ctx (see
// retry): only for a transaction of reads, or one that is harmless to
// send again. resent reports that an earlier try failed without an
// answer: it may have been applied, so a failed compare of the answer may
// be that write's own doing.
func (s *Store) commitTxn(ctx context.Context, txn func(ctx context.Context) clientv3.Txn) (resp *clientv3.TxnResponse, resent bool, err error) {
	tries, err := s.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = txn(ctx).Commit()
		return err
	})
	return resp, tries > 1, err
}

// retryable reports whether a failed request may succeed if sent again:
// no answer within its try (a timeout), no leader or a leader change, an
// unreachable member, a proposal dropped for want of a leader. Refusals
// (too large, no space, a bad request) are not.
func retryable(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, rpctypes.ErrNoLeader) ||
		errors.Is(err, rpctypes.ErrLeaderChanged) || errors.Is(err, rpctypes.ErrTimeout) ||
		errors.Is(err, rpctypes.ErrTimeoutDueToLeaderFail) || errors.Is(err, rpctypes.ErrTimeoutDueToConnectionLost) {
		return true
	}
	switch status.Code(err) {
	case codes.Unavailable, codes.DeadlineExceeded:
		return true
	}
	// raft drops a proposal made while its member knows no leader, before
	// it is logged: never applied. etcd passes it on as codes.Unknown.
	return strings.Contains(err.Error(), "raft proposal dropped")
}
