package bolt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// Call writes between the log and the data file. A write is durable once
// the writer has appended it to the log (writer.go); the applier then copies
// it into bbolt in the background, many writes to a transaction. Until then
// the write is the call's truth: every read of a call looks here first.

const (
	// applyLinger is how long the applier waits for more writes before it
	// applies a small batch: a bbolt commit costs two fdatasyncs and about
	// as much CPU as a hundred call writes, so fewer, larger ones are
	// cheaper, and its fdatasyncs queue on the disk in front of the log's.
	// Nothing waits for it but scans (flush does not linger) and webhook
	// deliveries, which wait deliveryLinger at most. Against 5 ms, 25 ms
	// gave at concurrency 1 on the shared box: the log's commit 238-347 µs
	// against 567-661 µs (mean), sync start p99 3.1-5.0 ms against
	// 10.8-13.1 ms; 100 ms against 25 ms (and batches of 1024 against 256):
	// the daemon's CPU per sync call 334 against 379 µs at c=1, 157 against
	// 182 µs at c=64 (medians of four A B rounds).
	applyLinger = 100 * time.Millisecond
	// deliveryLinger is applyLinger while a queued write makes a webhook
	// delivery due: the delivery is sent once its write is in the data file.
	deliveryLinger = 25 * time.Millisecond
	// applyBatch is the batch size that is applied at once, without lingering.
	applyBatch = 1024
	// applyBytes is what the held writes may carry before the applier
	// stops lingering: the linger saves bbolt commits of small writes,
	// while each held byte of a large payload is memory until it is
	// applied (TestPayloadQueueOf100x5MBStaysSmall holds 100 queued 5 MiB
	// inputs to 200 MiB of RSS).
	applyBytes = 8 << 20
	// maxHeld and maxHeldBytes bound the writes logged and not yet applied:
	// past them the writer waits for the applier, so a data file that
	// falls behind slows writes down rather than fill memory. A held
	// write's payload is its caller's buffer (a model's reply), live until
	// applied and no longer counted by the caller's budget once logged
	// (limits.replyBytes): at 256 MiB, 16 calls with 60 MiB replies held
	// four replies here beside the budget's two, and peaked at 419 to 588
	// MiB of RSS against 342 to 409 at 32 MiB (load 12; issue 41). A payload larger
	// than the bound waits for the one before it to be applied; small
	// writes meet maxHeld long before it.
	maxHeld      = 8192
	maxHeldBytes = 32 << 20
)

// logged is a call write in the log and not yet known to be in the data file.
// It never changes once added.
type logged struct {
	lsn uint64
	cw  callWrite
	// prev is the call's previous write when it was still unapplied as this
	// one was logged: where the inputs of a write that carries none are.
	prev *logged
}

func (l *logged) size() int64 {
	return int64(len(l.cw.value) + len(l.cw.inputs) + len(l.cw.outputs))
}

// pending is the writes logged and not yet applied, their index by call, and
// the applier's progress. Its methods are safe for concurrent use.
type pending struct {
	mu       sync.Mutex
	progress sync.Cond // broadcast after each apply attempt, and at stop
	byID     map[string]*logged
	idem     map[string]string // callidem key → call id, for logged writes with a key
	queue    []*logged         // to apply, in LSN order
	due      int               // writes in queue that make webhook deliveries due
	held     int               // writes in queue and in the batch being applied
	bytes    int64             // their payload bytes
	logged   uint64            // the LSN of the last write logged
	applied  uint64            // the LSN of the last write in the data file
	attempts uint64            // apply attempts so far
	err      error             // the last attempt's error; nil after a success
	waiting  int               // flushes waiting: the applier does not linger
	closed   bool              // nothing more will be logged
	done     bool              // the applier has returned (or there is none)

	grew   chan struct{} // the queue grew (cap 1)
	urgent chan struct{} // a flush, a close or a writer wants an attempt now (cap 1)
}

func newPending(applied uint64) *pending {
	p := &pending{byID: map[string]*logged{}, idem: map[string]string{}, logged: applied, applied: applied,
		grew: make(chan struct{}, 1), urgent: make(chan struct{}, 1)}
	p.progress.L = &p.mu
	return p
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// add records writes first, first+1, ... as logged (durable) and queues them
// for the applier. done is not kept: nobody calls it again.
func (p *pending) add(batch []callWrite, first uint64) {
	p.mu.Lock()
	for i := range batch {
		l := &logged{lsn: first + uint64(i), cw: batch[i]}
		l.cw.done = nil
		id := string(l.cw.key)
		l.prev = p.byID[id]
		p.byID[id] = l
		if l.cw.idem != nil {
			p.idem[string(l.cw.idem)] = id
		}
		p.queue = append(p.queue, l)
		if len(l.cw.deliveries) > 0 {
			p.due++
		}
		p.held++
		p.bytes += l.size()
		p.logged = l.lsn
	}
	p.mu.Unlock()
	poke(p.grew)
}

// get returns call id's latest write not yet applied, or nil.
func (p *pending) get(id string) *logged {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.byID[id]
}

// ids returns the calls with a logged, unapplied write, sorted.
func (p *pending) ids() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	ids := make([]string, 0, len(p.byID))
	for id := range p.byID {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// byIdem returns the call a logged, unapplied write gave idempotency key k.
func (p *pending) byIdem(k []byte) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	id, ok := p.idem[string(k)]
	return id, ok
}

// room is the writer's wait before an append: while the applier is behind
// by more than maxHeld writes or maxHeldBytes it waits for it. While applies
// fail (a full disk) it asks for an attempt now and returns its error if
// that fails too, so that the write is refused rather than logged on top of
// a backlog that cannot drain.
func (p *pending) room() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil { // the last apply failed: ask for one now
		at := p.attempts
		poke(p.urgent)
		for p.attempts == at && !p.done {
			p.progress.Wait()
		}
		if p.err != nil {
			return p.err
		}
	}
	for (p.held >= maxHeld || p.bytes >= maxHeldBytes) && p.err == nil && !p.done {
		p.progress.Wait()
	}
	return p.err
}

// flush waits until every write logged before it was called is applied (so
// that a scan of the data file sees it), the applier fails, or it stops.
func (p *pending) flush() {
	p.mu.Lock()
	defer p.mu.Unlock()
	target := p.logged
	p.waiting++
	defer func() { p.waiting-- }()
	for p.applied < target && !p.done {
		at := p.attempts
		poke(p.urgent)
		for p.attempts == at && !p.done {
			p.progress.Wait()
		}
		if p.err != nil {
			return
		}
	}
}

// take waits for writes to apply and returns them, or nil once closed with
// none left. A small batch waits up to applyLinger for more (deliveryLinger
// when one makes a webhook delivery due), unless a flush or Close wants it
// now.
func (p *pending) take() []*logged {
	var since time.Time // when the applier began to linger over this batch
	lingered := false
	for {
		p.mu.Lock()
		n, closed, hurry, due := len(p.queue), p.closed, p.waiting > 0, p.due > 0
		big := p.bytes >= applyBytes
		if n > 0 && (lingered || closed || hurry || big || n >= applyBatch) {
			batch := p.cutBatch()
			p.mu.Unlock()
			return batch
		}
		p.mu.Unlock()
		switch {
		case n == 0 && closed:
			return nil
		case n == 0:
			select {
			case <-p.grew:
			case <-p.urgent:
			}
		default:
			if since.IsZero() {
				since = time.Now()
			}
			linger := applyLinger
			if due {
				linger = deliveryLinger
			}
			left := linger - time.Since(since)
			if left <= 0 {
				lingered = true
				continue
			}
			// More writes may fill the batch, or make a delivery due:
			// look again when they come.
			t := time.NewTimer(left)
			select {
			case <-t.C:
				lingered = true
			case <-p.urgent:
				lingered = true
			case <-p.grew:
			}
			t.Stop()
		}
	}
}

// cutBatch takes the writes of one transaction from the front of the
// queue: all of them, unless their payloads pass applyBytes, then as many
// as fit in it, and at least one. Called with mu held.
//
// Why a bound: a bbolt commit allocates a buffer for every page it writes
// at once, about a large payload's size, and a write's payload is garbage
// only once its transaction is done; sixteen 60 MiB replies applied in one
// transaction made a gigabyte of both at once (issue 41).
func (p *pending) cutBatch() []*logged {
	k, bytes := 0, int64(0)
	for k < len(p.queue) && (k == 0 || bytes+p.queue[k].size() <= applyBytes) {
		bytes += p.queue[k].size()
		k++
	}
	batch := p.queue[:k:k]
	if k == len(p.queue) {
		p.queue, p.due = nil, 0
		return batch
	}
	// A copy of the rest: the queue's array would otherwise keep the
	// batch's writes, payloads and all, until the rest is applied too.
	p.queue = append([]*logged(nil), p.queue[k:]...)
	p.due = 0
	for _, l := range p.queue {
		if len(l.cw.deliveries) > 0 {
			p.due++
		}
	}
	return batch
}

// attempted records the outcome of applying batch. After a success the
// writes leave the index (unless a later write of the call is logged).
func (p *pending) attempted(batch []*logged, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.attempts++
	p.err = err
	p.progress.Broadcast()
	if err != nil {
		return
	}
	for _, l := range batch {
		id := string(l.cw.key)
		if p.byID[id] == l {
			delete(p.byID, id)
			if l.cw.idem != nil && p.idem[string(l.cw.idem)] == id {
				delete(p.idem, string(l.cw.idem))
			}
		}
		p.held--
		p.bytes -= l.size()
	}
	p.applied = batch[len(batch)-1].lsn
}

// backoff waits d after a failed attempt, or less when a writer, a flush or
// Close wants another; it reports false once closed (the writes stay in the
// log for the next open).
func (p *pending) backoff(d time.Duration) bool {
	if p.isClosed() {
		return false
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-p.urgent:
	}
	return true
}

func (p *pending) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// close says nothing more will be logged: the applier applies what is left
// (one attempt) and returns.
func (p *pending) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	poke(p.urgent)
}

// stopped marks the applier gone and reports whether every logged write is
// in the data file.
func (p *pending) stopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done = true
	p.progress.Broadcast()
	return p.applied == p.logged
}

// runApplier is the goroutine that applies logged writes to the data file,
// in log order, many to a transaction, and records in the same transaction
// the LSN of the last one (replay at Open starts after it). After a commit
// it wakes webhook deliveries the writes queued and removes the log segments
// the data file now holds. A failed commit (a full disk) is retried, backing
// off up to a second, the batch kept whole; writers see its error meanwhile
// (room).
func (s *Store) runApplier() {
	defer close(s.applierDone)
	var backoff time.Duration
	for {
		batch := s.pend.take()
		if batch == nil {
			return
		}
		for {
			queued, err := s.applyLogged(batch)
			if err == nil {
				// Before the writes count as applied: a scan that waited
				// for them (PendingDeliveries) finds the hooks told.
				for _, ds := range queued {
					s.deliveryHooks.Notify(ds)
				}
			}
			s.pend.attempted(batch, err)
			if err == nil {
				s.log.release(batch[len(batch)-1].lsn)
				backoff = 0
				break
			}
			backoff = min(max(2*backoff, 10*time.Millisecond), time.Second)
			if !s.pend.backoff(backoff) {
				return
			}
		}
	}
}

// applyLogged writes batch into the data file in one transaction and
// returns the webhook deliveries it queued.
func (s *Store) applyLogged(batch []*logged) (queued [][]store.Delivery, err error) {
	applyFailpoint("before", batch)
	if s.applyHook != nil {
		if err := s.applyHook(); err != nil {
			return nil, wrapApplyErr(storageErr(err))
		}
	}
	err = s.update(func(tx *bbolt.Tx) error {
		queued = queued[:0]
		var roll usageRoll // the batch's usage, one row write per hour, team and project
		for _, l := range batch {
			cw := l.cw // applyCallWrite may add the stored inputs to its value
			if err := applyCallWrite(tx, &cw, &roll); err != nil {
				return err
			}
			if len(cw.queued) > 0 {
				queued = append(queued, cw.queued)
			}
		}
		if err := roll.write(tx); err != nil {
			return err
		}
		return putWALApplied(tx, batch[len(batch)-1].lsn)
	})
	if err != nil {
		return nil, wrapApplyErr(err)
	}
	applyFailpoint("after", batch)
	return queued, nil
}

func wrapApplyErr(err error) error { return fmt.Errorf("apply logged call writes: %w", err) }

var keyWALApplied = []byte("walapplied")

func putWALApplied(tx *bbolt.Tx, lsn uint64) error {
	return tx.Bucket(bucketMeta).Put(keyWALApplied, binary.BigEndian.AppendUint64(nil, lsn))
}

// walApplied is the LSN of the last logged write the data file holds (0 for
// a file that never had a log).
func walApplied(tx *bbolt.Tx) uint64 {
	if b := tx.Bucket(bucketMeta); b != nil {
		if v := b.Get(keyWALApplied); len(v) == 8 {
			return binary.BigEndian.Uint64(v)
		}
	}
	return 0
}

// replayChunk bounds the writes replay applies in one transaction.
const replayChunk = 1000

// replayWAL applies the writes the log beside the data file holds and the
// file does not (a daemon killed before its applier caught up), then
// removes the log, and returns the LSN the next write gets.
func replayWAL(db *bbolt.DB, path string) (next uint64, err error) {
	var applied uint64
	if err := db.View(func(tx *bbolt.Tx) error { applied = walApplied(tx); return nil }); err != nil {
		return 0, err
	}
	recs, segs, last, err := readWAL(path, applied)
	if err != nil {
		return 0, err
	}
	for chunk := range slices.Chunk(recs, replayChunk) {
		err := db.Update(func(tx *bbolt.Tx) error {
			var roll usageRoll // a decoded write's usage is read from its record
			for _, r := range chunk {
				cw, err := decodeWALWrite(r.body)
				if err != nil {
					return walError(path, fmt.Sprintf("write %d: %v", r.lsn, err))
				}
				if err := applyCallWrite(tx, &cw, &roll); err != nil {
					return err
				}
			}
			if err := roll.write(tx); err != nil {
				return err
			}
			return putWALApplied(tx, chunk[len(chunk)-1].lsn)
		})
		var oe *openError
		if errors.As(err, &oe) {
			return 0, err
		}
		if err != nil {
			return 0, fmt.Errorf("replay the write-ahead log of %s: %w", path, storageErr(err))
		}
	}
	if err := removeSegments(path, segs); err != nil {
		return 0, err
	}
	return last + 1, nil
}

// loadWAL is replayWAL for a store opened read-only: the writes the file
// lacks are read into p, not applied, so reads see them.
func loadWAL(db *bbolt.DB, path string, p *pending) error {
	var applied uint64
	if err := db.View(func(tx *bbolt.Tx) error { applied = walApplied(tx); return nil }); err != nil {
		return err
	}
	recs, _, _, err := readWAL(path, applied)
	if err != nil {
		return err
	}
	for _, r := range recs {
		cw, err := decodeWALWrite(r.body)
		if err != nil {
			return walError(path, fmt.Sprintf("write %d: %v", r.lsn, err))
		}
		p.add([]callWrite{cw}, r.lsn)
	}
	return nil
}

// readLogged is a read of call l.cw.key from its logged write, as readCall
// reads it from the data file: inputs and outputs included or left out
// (InputBytes then says the inputs' size).
func (s *Store) readLogged(l *logged, inputs, outputs bool) (store.Call, error) {
	var c store.Call
	if err := decodeCall(l.cw.value, &c); err != nil {
		return c, err
	}
	switch {
	case len(l.cw.outputs) > 0 && outputs:
		c.Outputs = slices.Clone(json.RawMessage(l.cw.outputs))
	case !outputs:
		c.Outputs = nil
	}
	in, size, err := s.loggedInputs(l, c.Inputs, inputs)
	if err != nil {
		return c, err
	}
	c.Inputs, c.InputBytes = in, size
	return c, nil
}

// loggedInputs finds the inputs of l's call: in l (small ones in its record,
// decoded as rec), in the latest earlier write that carried some, or in the
// data file. It returns them when want is set, and their size.
func (s *Store) loggedInputs(l *logged, rec json.RawMessage, want bool) (json.RawMessage, int64, error) {
	src := l
	for src != nil && !src.cw.hasInputs {
		src = src.prev
	}
	var in json.RawMessage
	switch {
	case src == nil:
		return s.storedInputs(string(l.cw.key), want)
	case len(src.cw.inputs) > 0:
		in = src.cw.inputs
	case src == l:
		in = rec
	default:
		var r struct {
			Inputs json.RawMessage `json:"inputs"`
		}
		if err := json.Unmarshal(src.cw.value, &r); err != nil {
			return nil, 0, fmt.Errorf("decode call: %w", err)
		}
		in = r.Inputs
	}
	size := int64(len(in))
	if !want {
		return nil, size, nil
	}
	return slices.Clone(in), size, nil
}

// storedInputs reads call id's inputs from the data file (nil when it holds
// none), with their size; only the size unless want.
func (s *Store) storedInputs(id string, want bool) (json.RawMessage, int64, error) {
	var (
		in   json.RawMessage
		size int64
	)
	err := s.view(func(tx *bbolt.Tx) error {
		key := []byte(id)
		v := tx.Bucket(bucketCalls).Get(key)
		if v == nil {
			return nil
		}
		var c store.Call
		if err := decodeCall(v, &c); err != nil {
			return err
		}
		readPayloads(tx, key, &c, want, false)
		in, size = c.Inputs, c.InputBytes
		return nil
	})
	return in, size, err
}
