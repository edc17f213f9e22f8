package scheduler

import (
	"context"
	"slices"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// call is the loop's record of one live call: from admission until its final
// write has committed. Its state moves only as lifecycle.go allows.
type call struct {
	// c is what Lookup shows. It keeps the running state while the final
	// write is in flight, so that nobody reads a result that is not durable.
	// Its Inputs are dropped once durable (see onPersisted): a queued call
	// keeps only its metadata, and the inputs are read at dispatch.
	c     store.Call
	state callState
	// bytes is the size of the inputs, counted in its project's queued
	// bytes while it waits (fifo.bytes).
	bytes int64
	// unsaved: a sync start still waiting, so nobody knows the call's ID and
	// nothing is written for it until its final write or its first (see
	// Scheduler.persist); its queued and running moves are not written.
	unsaved bool
	// unstored: an unsaved call whose final write, its only one, failed. The
	// store does not know it, so the start must not hand out its ID.
	unstored bool
	// done is closed once the final write has committed (or failed: see
	// evFinal), or the call is dropped; never earlier.
	done chan struct{}
	p    *project
	// result is the outcome once decided (finishing), then the call as its
	// final write left it; read off the loop only after done is closed (the
	// close orders the write before the read).
	result store.Call
	// reply is what its model's reply holds of the replies' budget, from
	// the Infer's end until its final write has committed (onFinal).
	reply *replyAccount

	expiry timer // queueTimeout: armed while the call waits to be dispatched

	// While running:
	r           *rep
	cancel      context.CancelFunc // ends the Infer goroutine
	timeout     timer              // inference timeout
	timeoutSecs int                // its length, for the message
	// abortedOn: the replica whose request for this call was aborted
	// (cancel); it is not free until that Infer returns (see rep.aborting).
	abortedOn *rep

	// For its usage (usage.go): its share of its replicas' time so far,
	// the GPUs its last replica held (and counts as), and what the
	// backend measured over its run.
	replicaSeconds float64
	shareFrom      float64 // its replica's callShare when it attached
	gpus           int
	gpuWeight      float64
	measured       *backend.Usage
	// b is the batch it runs in (batch.go); nil when it runs alone.
	b *batch
}

// fifo is a project's queue of calls waiting for a replica, oldest first.
// It counts the bytes of their inputs as calls come and go: the one place
// queued bytes are accounted (see budget.go).
type fifo struct {
	items []*call
	head  int
	bytes int64 // sum of the queued calls' bytes
}

func (q *fifo) len() int { return len(q.items) - q.head }

func (q *fifo) push(c *call) {
	q.items = append(q.items, c)
	q.bytes += c.bytes
}

// pushFront puts c back in front of the oldest call.
func (q *fifo) pushFront(c *call) {
	q.bytes += c.bytes
	if q.head > 0 {
		q.head--
		q.items[q.head] = c
		return
	}
	q.items = append(q.items, nil)
	copy(q.items[1:], q.items)
	q.items[0] = c
}

// peek returns the oldest call, or nil.
func (q *fifo) peek() *call {
	if q.head == len(q.items) {
		return nil
	}
	return q.items[q.head]
}

// pop removes the oldest call.
func (q *fifo) pop() *call {
	c := q.items[q.head]
	q.items[q.head] = nil
	q.head++
	q.bytes -= c.bytes
	if q.head == len(q.items) {
		q.items, q.head = q.items[:0], 0
	} else if q.head > 64 && q.head*2 > len(q.items) {
		// Compact so that a long-lived busy queue does not grow without bound.
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items, q.head = q.items[:n], 0
	}
	return c
}

// remove takes c out of the queue wherever it is; it reports whether it was
// there. Rare (a failed created write), so linear.
func (q *fifo) remove(c *call) bool {
	for i := q.head; i < len(q.items); i++ {
		if q.items[i] == c {
			q.bytes -= c.bytes
			copy(q.items[i:], q.items[i+1:])
			q.items[len(q.items)-1] = nil
			q.items = q.items[:len(q.items)-1]
			return true
		}
	}
	return false
}

// drain empties the queue and returns its calls, oldest first.
func (q *fifo) drain() []*call {
	out := append([]*call(nil), q.items[q.head:]...)
	q.bytes = 0
	clear(q.items)
	q.items, q.head = q.items[:0], 0
	return out
}

// ranks of the priorities, higher first.
const (
	rankLow = iota
	rankNormal
	rankHigh
	numRanks
)

func rankOf(p store.Priority) int {
	switch p {
	case store.PriorityHigh:
		return rankHigh
	case store.PriorityLow:
		return rankLow
	}
	return rankNormal
}

// queue is a project's calls waiting for a replica: one fifo per priority.
// The next call is the head that ranks highest once aged: each aging period
// a call has waited adds one rank, so a low call waits at most two periods
// behind a stream of fresh high ones (it then ties, and the older call goes
// first). Within a priority, calls go oldest first.
type queue struct {
	levels [numRanks]fifo
	aging  time.Duration // one rank per this much waiting; 0 = no aging
}

func (q *queue) len() int {
	n := 0
	for i := range q.levels {
		n += q.levels[i].len()
	}
	return n
}

// bytes is the size of the inputs of the calls waiting (see fifo.bytes).
func (q *queue) bytes() int64 {
	var n int64
	for i := range q.levels {
		n += q.levels[i].bytes
	}
	return n
}

// lenLow is how many low-priority calls wait: the ones that may only use
// capacity nobody else waits for (see project.want).
func (q *queue) lenLow() int { return q.levels[rankLow].len() }

func (q *queue) push(c *call) { q.levels[rankOf(c.c.Priority)].push(c) }

// pushFront puts c back in front of its priority's calls.
func (q *queue) pushFront(c *call) { q.levels[rankOf(c.c.Priority)].pushFront(c) }

// effRank is c's rank after aging at now.
func (q *queue) effRank(c *call, now time.Time) int {
	r := rankOf(c.c.Priority)
	if q.aging > 0 {
		if waited := now.Sub(c.c.Created); waited > 0 {
			r += int(waited / q.aging)
		}
	}
	return r
}

// before reports whether a goes before b at now.
func (q *queue) before(a, b *call, now time.Time) bool {
	ra, rb := q.effRank(a, now), q.effRank(b, now)
	if ra != rb {
		return ra > rb
	}
	if !a.c.Created.Equal(b.c.Created) {
		return a.c.Created.Before(b.c.Created)
	}
	return rankOf(a.c.Priority) > rankOf(b.c.Priority)
}

// peek returns the call to dispatch next at now, or nil.
func (q *queue) peek(now time.Time) *call {
	var best *call
	for i := range q.levels {
		if c := q.levels[i].peek(); c != nil && (best == nil || q.before(c, best, now)) {
			best = c
		}
	}
	return best
}

// each calls fn with the queued calls in the order peek and pop would hand
// them out at now, until fn returns false; it changes nothing.
func (q *queue) each(now time.Time, fn func(*call) bool) {
	var next [numRanks]int
	for i := range q.levels {
		next[i] = q.levels[i].head
	}
	for {
		best, level := (*call)(nil), -1
		for i := range q.levels {
			if l := &q.levels[i]; next[i] < len(l.items) {
				if c := l.items[next[i]]; best == nil || q.before(c, best, now) {
					best, level = c, i
				}
			}
		}
		if best == nil || !fn(best) {
			return
		}
		next[level]++
	}
}

// pop removes the call peek returned.
func (q *queue) pop(c *call) { q.levels[rankOf(c.c.Priority)].pop() }

// remove takes c out of the queue wherever it is; it reports whether it was
// there.
func (q *queue) remove(c *call) bool { return q.levels[rankOf(c.c.Priority)].remove(c) }

// drain empties the queue and returns its calls, highest priority first.
func (q *queue) drain() []*call {
	var out []*call
	for i := numRanks - 1; i >= 0; i-- {
		out = append(out, q.levels[i].drain()...)
	}
	return out
}

// first returns up to n queued calls in the order they would be
// dispatched at now.
func (q *queue) first(n int, now time.Time) []*call {
	var all []*call
	for i := range q.levels {
		l := &q.levels[i]
		all = append(all, l.items[l.head:]...)
	}
	slices.SortStableFunc(all, func(a, b *call) int {
		switch {
		case q.before(a, b, now):
			return -1
		case q.before(b, a, now):
			return 1
		}
		return 0
	})
	return all[:min(n, len(all))]
}

// position is how many queued calls go before c at now (0 = next), as the
// queue stands: calls that age past c later may still overtake it.
func (q *queue) position(c *call, now time.Time) int {
	n := 0
	for i := range q.levels {
		l := &q.levels[i]
		for j := l.head; j < len(l.items); j++ {
			if o := l.items[j]; o != c && q.before(o, c, now) {
				n++
			}
		}
	}
	return n
}
