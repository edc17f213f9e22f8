package etcd

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"inferd/store"
)

// Bounds of one group commit, under etcd's defaults of 128 operations and
// 1.5 MiB per request. A call write counts 4 to 15 operations (a fenced
// final call with an idempotency key, its usage entry, its inputs, two
// webhook deliveries and, with Options.Payloads, the outputs' reference),
// so a batch holds 8 to 30 calls. etcd counts a nested transaction's operations against what
// its parent leaves (a nested transaction may hold 128 less its parent's
// own count), so opCount counts every operation at every level, and a
// nested transaction's compares too: the sum bounds each level.
const (
	batchOps   = 120
	batchBytes = 1 << 20
)

// callWrite is one queued SaveCallAsync.
type callWrite struct {
	id   string
	ops  []clientv3.Op // the call, its outputs and indexes (callOps)
	size int
	done func(error)

	inputOps []clientv3.Op // its inputs, when the write carries them

	held *heldPayloads // its payloads held on nodes; nil when all are inline

	deliveries []store.Delivery // webhook deliveries the write makes due
	records    []string         // their outbox records (outboxRecord JSON), in the same order
	queued     []store.Delivery // those the commit put in the outbox (set by commit)

	fence binding // the lease the call's writes are fenced on; zero: none
	final bool    // the call is final: its binding ends with this write
}

// opCount is how many operations the write adds to a transaction at most:
// its call's, its inputs', its held payloads' refs, two per delivery (a
// nested transaction with two compares and one operation) and one for the
// nested transaction a fenced write is. That nested transaction's two
// compares, and the reads of its failure branch (three and one per
// delivery), never outnumber the operations it holds, so its level is
// bounded by them.
func (cw callWrite) opCount() int {
	n := len(cw.ops) + len(cw.inputOps) + 2*len(cw.deliveries)
	if cw.held != nil {
		n += cw.held.nOps
	}
	if cw.fence.fenced() {
		n++
	}
	return n
}

// callOps are the write's call operations with its held outputs' ref;
// allInputOps its inputs' with their ref. Only once held is ready.
func (cw callWrite) callOps() []clientv3.Op {
	if cw.held == nil {
		return cw.ops
	}
	return append(slices.Clip(cw.ops), cw.held.outOps...)
}

func (cw callWrite) allInputOps() []clientv3.Op {
	if cw.held == nil {
		return cw.inputOps
	}
	return append(slices.Clip(cw.inputOps), cw.held.inOps...)
}

// writer is the store's one call-writing goroutine: it commits whatever is
// queued as one transaction, in queue order. It is owned by the Store: start
// in Open, stop in Close.
type writer struct {
	s        *Store
	mu       sync.Mutex
	queue    []callWrite
	closing  bool
	kick     chan struct{} // a write was queued (one wake-up is enough)
	finished chan struct{} // closed when the goroutine has returned
}

func (w *writer) start(s *Store) {
	w.s = s
	w.kick = make(chan struct{}, 1)
	w.finished = make(chan struct{})
	go w.run()
}

// wake has the goroutine look at the queue again: a write held back for
// its payloads may be ready.
func (w *writer) wake() {
	select {
	case w.kick <- struct{}{}:
	default:
	}
}

// enqueue queues cw, or reports false once the store is closing.
func (w *writer) enqueue(cw callWrite) bool {
	w.mu.Lock()
	if w.closing {
		w.mu.Unlock()
		return false
	}
	w.queue = append(w.queue, cw)
	w.mu.Unlock()
	w.wake()
	return true
}

// stop lets the writes queued so far commit, then ends the goroutine.
func (w *writer) stop() {
	w.mu.Lock()
	w.closing = true
	w.mu.Unlock()
	w.wake()
	<-w.finished
}

func (w *writer) run() {
	defer close(w.finished)
	for {
		w.mu.Lock()
		batch, failed := w.take()
		done := w.closing && len(w.queue) == 0
		w.mu.Unlock()
		for _, cw := range failed {
			cw.done(cw.held.err)
		}
		if len(batch) == 0 {
			if done && len(failed) == 0 {
				return
			}
			if len(failed) == 0 {
				<-w.kick // a write queued, payloads held, or stop
			}
			continue
		}
		fenced, err := w.commit(batch)
		for _, cw := range batch {
			switch {
			case err != nil:
				cw.done(fmt.Errorf("save call %s: %w", cw.id, err))
				continue
			case fenced[cw.id] != nil:
				cw.done(fenced[cw.id])
			default:
				w.s.deliveryHooks.Notify(cw.queued)
				cw.done(nil)
			}
			if cw.final {
				// Ended here: committed, or refused for good (a lease
				// never comes back, nor a call handed on or finished
				// elsewhere).
				w.s.fence.release(cw.id, cw.fence)
			}
		}
	}
}

// take removes the next batch from the queue: up to batchOps operations
// and about batchBytes, counting every write (a call written twice counts
// twice, though commit sends its last write's call operations only). A
// write whose payloads are still being held on nodes stays queued, and so
// do the later writes of its call, so each call's writes commit in the
// order queued; other calls' writes pass it. A write whose payloads could
// not be held is removed into failed. Callers hold mu.
func (w *writer) take() (batch, failed []callWrite) {
	ops, size, full := 0, 0, false
	var waiting map[string]bool // calls with a write still holding its payloads
	rest := w.queue[:0:0]
	for i, cw := range w.queue {
		switch {
		case full || waiting[cw.id]:
			rest = append(rest, cw)
		case cw.held != nil && !cw.held.isReady():
			if waiting == nil {
				waiting = map[string]bool{}
			}
			waiting[cw.id] = true
			rest = append(rest, cw)
		case cw.held != nil && cw.held.err != nil:
			failed = append(failed, cw)
		case len(batch) > 0 && (ops+cw.opCount() > batchOps || size+cw.size > batchBytes):
			if waiting == nil && len(failed) == 0 {
				// The common case: nothing held back, the rest stays as is.
				w.queue = w.queue[i:]
				return batch, nil
			}
			full = true // what follows waits for the next batch, in order
			rest = append(rest, cw)
		default:
			ops += cw.opCount()
			size += cw.size
			batch = append(batch, cw)
		}
	}
	w.queue = rest
	return batch, failed
}

// commit writes the batch in one transaction and returns the calls whose
// writes it refused because a fence compare failed, each with its error
// (wrapping store.ErrFenced).
//
// A call queued more than once in the batch is written once, with its
// last write: etcd refuses a transaction that names a key twice, and the
// last write is the one that must win. Its inputs are those of its last
// write that carried any (a later write without inputs keeps them), and
// its deliveries those of all its writes, each once (the first write's
// record). A call bound to a lease (fence.go) is written by a nested
// transaction that compares the node's key's lease with the call's, and
// that the call is still this node's (or absent, for a creation), its
// deliveries inside it: a failed compare refuses that call's writes and
// queues none of its deliveries, and the rest of the batch commits.
// Whether the call exists as this node's is read here, not when the write
// was queued: a creation's later write queued before the creation
// committed compares the pending entry the creation put.
//
// While etcd has no leader the commit is retried, each try bounded by
// TryTimeout, for up to RetryFor (retry.go); then the deliveries a retry finds already queued by this very batch (an
// earlier try that was applied but whose answer was lost) count as queued
// by it, so their hooks still run, once.
//
// Likewise a fenced write whose compare fails on a retry, finding the
// call's record as it writes it (its own earlier try put it, and deleted
// the pending entry of a final write or created the record), counts as
// committed.
func (w *writer) commit(batch []callWrite) (map[string]error, error) {
	return w.commitAfter(batch, 0)
}

// commitAfter is commit as if it had been sent tries times before (tests
// stand for a retry of a try that etcd applied, its answer lost).
func (w *writer) commitAfter(batch []callWrite, tries int) (map[string]error, error) {
	last, lastInputs := map[string]int{}, map[string]int{}
	for i, cw := range batch {
		last[cw.id] = i
		if len(cw.inputOps) > 0 {
			lastInputs[cw.id] = i
		}
	}
	type queuedBy struct {
		write, delivery int    // batch[write].deliveries[delivery]
		record          string // the outbox record it puts
	}
	// group is one call's operations in the transaction, in the order of
	// the calls' last writes.
	type group struct {
		id     string
		fence  binding
		exists bool   // a fenced call's: compares its pending entry, not its absence
		record []byte // the calls/<id> value it puts
		ops    []clientv3.Op
		queues []queuedBy // after the call's own ops, in ops
	}
	var groups []*group
	byID := map[string]*group{}
	for i, cw := range batch {
		if last[cw.id] == i {
			g := &group{id: cw.id, fence: cw.fence}
			byID[cw.id] = g
			groups = append(groups, g)
		}
	}
	seen := map[string]bool{}
	for i, cw := range batch {
		g := byID[cw.id]
		if last[cw.id] == i {
			g.ops = append(g.ops, cw.callOps()...)
			g.record = cw.ops[0].ValueBytes() // callOps: the record's put first
		}
		if j, ok := lastInputs[cw.id]; ok && j == i {
			g.ops = append(g.ops, cw.allInputOps()...)
		}
	}
	for i, cw := range batch {
		g := byID[cw.id]
		for j, d := range cw.deliveries {
			if !seen[d.ID] {
				seen[d.ID] = true
				g.queues = append(g.queues, queuedBy{i, j, cw.records[j]})
				g.ops = append(g.ops, w.s.queueOp(d.ID, cw.records[j]))
			}
		}
	}
	s := w.s
	var ops []clientv3.Op
	at := make([]int, len(groups)) // each group's first response (unfenced) or its nested transaction's
	for k, g := range groups {
		at[k] = len(ops)
		if g.fence.fenced() {
			g.exists = s.fence.existing(g.id)
			if !g.exists {
				// A creation: its compare holds only while calls/<id> is
				// absent, and then so is every key its writes delete (its
				// pending entry, its outputs, its payloads' refs: keys only
				// an earlier write of the call puts), so it sends none.
				g.ops = slices.DeleteFunc(g.ops, func(op clientv3.Op) bool { return op.IsDelete() })
			}
			reads := make([]string, len(g.queues))
			for n, q := range g.queues {
				reads[n] = batch[q.write].deliveries[q.delivery].ID
			}
			ops = append(ops, clientv3.OpTxn(s.fenceCmps(g.id, g.fence, g.exists), g.ops,
				s.fenceReads(g.id, g.fence, reads)))
		} else {
			ops = append(ops, g.ops...)
		}
	}
	start := time.Now()
	var resp *clientv3.TxnResponse
	err := s.retrying(func(ctx context.Context) (err error) {
		tries++
		resp, err = s.cli.Txn(ctx).Then(ops...).Commit()
		return err
	})
	s.stats.add(len(batch), time.Since(start))
	if err != nil {
		return nil, s.wrap("commit", err)
	}
	var fenced map[string]error
	for k, g := range groups {
		rs := resp.Responses[at[k]:]
		first := len(g.ops) - len(g.queues)
		queued := queuedNow
		if g.fence.fenced() {
			t := resp.Responses[at[k]].GetResponseTxn()
			switch {
			case t.Succeeded:
				rs = t.Responses
			case tries > 1 && foundValue(t.Responses[0], string(g.record)):
				// An earlier try was applied: its deliveries are those
				// found with their records.
				rs, first, queued = t.Responses, fenceReadsFirst, foundValue
			default:
				if fenced == nil {
					fenced = map[string]error{}
				}
				fenced[g.id] = s.fencedBecause(g.id, g.fence, g.exists, t)
				continue
			}
		}
		// Stored: its later writes compare its pending entry, no longer
		// its absence (run forgets it after a final write).
		s.fence.written(g.id, g.fence)
		for n, q := range g.queues {
			if queued(rs[first+n], q.record) {
				cw := &batch[q.write]
				cw.queued = append(cw.queued, cw.deliveries[q.delivery])
			}
		}
	}
	return fenced, nil
}

// commitStats counts the writer's commits, for metrics.
type commitStats struct {
	commits, writes, nanos atomic.Int64
}

func (c *commitStats) add(writes int, d time.Duration) {
	c.commits.Add(1)
	c.writes.Add(int64(writes))
	c.nanos.Add(int64(d))
}

// CommitStats returns the writer's commits since Open, for metrics.
func (s *Store) CommitStats() store.CommitStats {
	return store.CommitStats{
		Commits:  s.stats.commits.Load(),
		Writes:   s.stats.writes.Load(),
		Duration: time.Duration(s.stats.nanos.Load()),
	}
}
