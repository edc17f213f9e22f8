package scheduler

import (
	"context"

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

	// While running:
	r           *rep
	cancel      context.CancelFunc // ends the Infer goroutine
	timeout     timer              // inference timeout
	timeoutSecs int                // its length, for the message
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
