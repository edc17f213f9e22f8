package scheduler

import (
	"context"
	"sync"

	"inferd/scheduler/backend"
)

// DefaultReplyBytes is the default of Config.ReplyBytes
// (limits.replyBytes): 128 MiB of model replies held at once, two of the
// largest a model may send (64 MiB).
const DefaultReplyBytes = 128 << 20

// replyBudget bounds the bytes of model replies held at once, from the
// moment a reply's buffer is allocated until its call's final write has
// committed (issue 41: one project at concurrency 16 with 60 MiB replies
// took the daemon to 1.55 GB). A reply whose length is known waits for
// room, holding nothing meanwhile, in the order they asked (its model's
// reply waits in the socket; the call's inference timeout bounds the
// wait); one of unknown length takes its buffer's growth only when there
// is room, else is refused. It is safe for concurrent use.
type replyBudget struct {
	max int64 // 0: no budget

	mu      sync.Mutex
	used    int64
	waiters []*replyWaiter // in the order they asked
}

// replyWaiter is a reply waiting for n bytes; ready is closed once they
// are its.
type replyWaiter struct {
	n     int64
	ready chan struct{}
}

func newReplyBudget(max int64) *replyBudget { return &replyBudget{max: max} }

// inUse returns the bytes held now.
func (b *replyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// account opens one call's account; nil without a budget.
func (b *replyBudget) account() *replyAccount {
	if b.max <= 0 {
		return nil
	}
	return &replyAccount{b: b}
}

// replyAccount is one call's share of the budget: what its reply holds.
// Take runs on the goroutine running the call's Infer; release on the
// loop, once the Infer has returned.
type replyAccount struct {
	b    *replyBudget
	mu   sync.Mutex
	held int64
}

// Take implements backend.ReplyHold.
func (a *replyAccount) Take(ctx context.Context, n int64, wait bool) error {
	b := a.b
	if n > b.max {
		return &backend.ReplyBudgetError{Max: b.max}
	}
	b.mu.Lock()
	if b.used+n <= b.max && (!wait || len(b.waiters) == 0) {
		b.used += n
		b.mu.Unlock()
		a.add(n)
		return nil
	}
	if !wait {
		b.mu.Unlock()
		return &backend.ReplyBudgetError{Max: b.max}
	}
	w := &replyWaiter{n: n, ready: make(chan struct{})}
	b.waiters = append(b.waiters, w)
	b.mu.Unlock()
	select {
	case <-w.ready:
		a.add(n)
		return nil
	case <-ctx.Done():
		b.mu.Lock()
		defer b.mu.Unlock()
		select {
		case <-w.ready: // given just now: give it back
			b.used -= n
			b.wakeLocked()
		default:
			for i, o := range b.waiters {
				if o == w {
					b.waiters = append(b.waiters[:i], b.waiters[i+1:]...)
					break
				}
			}
			b.wakeLocked() // the next may fit now that this one is gone
		}
		return ctx.Err()
	}
}

func (a *replyAccount) add(n int64) {
	a.mu.Lock()
	a.held += n
	a.mu.Unlock()
}

// release gives back all the account holds. A nil account holds nothing.
func (a *replyAccount) release() {
	if a == nil {
		return
	}
	a.mu.Lock()
	n := a.held
	a.held = 0
	a.mu.Unlock()
	if n == 0 {
		return
	}
	b := a.b
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	b.wakeLocked()
}

// wakeLocked hands room to the waiters in order, while the first fits;
// b.mu is held.
func (b *replyBudget) wakeLocked() {
	for len(b.waiters) > 0 && b.used+b.waiters[0].n <= b.max {
		w := b.waiters[0]
		b.waiters = b.waiters[1:]
		b.used += w.n
		close(w.ready)
	}
}

// ReplyBytes returns the bytes of model replies held now
// (inferd_model_reply_bytes).
func (s *Scheduler) ReplyBytes() int64 { return s.replies.inUse() }
