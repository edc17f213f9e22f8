package bolt

import (
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// callWrite is one queued SaveCall: the record already encoded by the
// caller, so the writer's transaction does no JSON work (but to keep small
// inputs a write does not carry), and the large payloads as the caller gave
// them (held, not copied, until the commit).
type callWrite struct {
	key   []byte
	value []byte
	// hasInputs: the write carries inputs, in value when small, else in
	// inputs; without, the stored inputs are kept.
	hasInputs bool
	inputs    []byte    // large inputs, for callinputs
	outputs   []byte    // large outputs, for calloutputs
	final     bool      // state is succeeded or failed
	finished  time.Time // set when final
	// usage is what a final write adds to the usage roll-up, worked out
	// from the call when it was queued; nil when it adds nothing, or for a
	// write decoded from its record (addCallUsage reads it from the value).
	usage *store.UsageRow
	idem  []byte // the callidem key, for a call with an idempotency key
	done  func(error)

	deliveries        []store.Delivery // webhook deliveries the write makes due
	encodedDeliveries [][]byte         // their JSON, in the same order
	queued            []store.Delivery // those the commit put in the outbox (set by queueDeliveries)
}

// writer is the queue in front of the one goroutine that commits call
// records (runWriter).
//
// Invariants: queue is appended to only under mu and only while !closed; the
// writer goroutine is the only one that takes from it, and it exits only
// when closed is set and the queue is empty, so everything queued before
// Close is committed (or failed) before Close returns.
type writer struct {
	mu      sync.Mutex
	cond    sync.Cond // signalled when queue grows or closed is set
	queue   []callWrite
	closed  bool
	stopped chan struct{} // closed when runWriter returns
}

func (w *writer) init() {
	w.cond.L = &w.mu
	w.stopped = make(chan struct{})
}

// enqueue adds cw to the queue, or reports false if the store is closed.
func (w *writer) enqueue(cw callWrite) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return false
	}
	w.queue = append(w.queue, cw)
	w.cond.Signal()
	return true
}

// take waits for queued writes and returns all of them, reusing buf's
// storage for the next queue. It returns nil once closed and drained.
func (w *writer) take(buf []callWrite) []callWrite {
	w.mu.Lock()
	defer w.mu.Unlock()
	for len(w.queue) == 0 && !w.closed {
		w.cond.Wait()
	}
	if len(w.queue) == 0 {
		return nil
	}
	batch := w.queue
	w.queue = buf[:0]
	return batch
}

func (w *writer) stop() {
	w.mu.Lock()
	w.closed = true
	w.cond.Signal()
	w.mu.Unlock()
	<-w.stopped
}

// runWriter is the group-commit loop. Each round takes everything queued and
// applies it, in queue order, in one write transaction: one commit (two
// fdatasyncs) for the whole group. The next round starts as soon as the
// commit ends, with whatever queued meanwhile, so there is no batching delay
// for a lone writer and a busy one amortises each fsync over many calls.
// A failed commit fails every write of its group; the loop goes on.
func (s *Store) runWriter() {
	defer close(s.w.stopped)
	var buf []callWrite
	for {
		batch := s.w.take(buf)
		if batch == nil {
			return
		}
		start := time.Now()
		commitFailpoint("before", batch)
		err := s.update(func(tx *bbolt.Tx) error {
			var roll usageRoll // the group's usage, one row write per hour, team and project
			for i := range batch {
				if err := applyCallWrite(tx, &batch[i], &roll); err != nil {
					return err
				}
			}
			return roll.write(tx)
		})
		if err == nil {
			commitFailpoint("after", batch)
		}
		s.commits.Add(1)
		s.commitWrite.Add(int64(len(batch)))
		s.commitNanos.Add(int64(time.Since(start)))
		if err != nil {
			err = wrapSaveErr(err)
		}
		for i := range batch {
			if err == nil {
				s.deliveryHooks.Notify(batch[i].queued)
			}
			batch[i].done(err)
		}
		clear(batch) // drop references to records and callbacks
		buf = batch
	}
}

// CommitStats returns the group-commit counters, for metrics.
func (s *Store) CommitStats() store.CommitStats {
	return store.CommitStats{
		Commits:  s.commits.Load(),
		Writes:   s.commitWrite.Load(),
		Duration: time.Duration(s.commitNanos.Load()),
	}
}
