package bolt

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// SaveCall durably creates or replaces the call: it returns once the write is
// committed, or with the commit's error (ErrStorageFull for a full disk,
// ErrClosed after Close). ctx bounds only the wait: a write already queued
// still happens when ctx ends. A call in a final state without Finished gets
// the current time.
func (s *Store) SaveCall(ctx context.Context, c store.Call) error {
	return store.SaveCallAndWait(ctx, s, c)
}

// SaveCallAsync queues the call for the group-commit writer and returns at
// once; done receives the commit's result (nil once durable). Writes apply in
// the order they were queued, so a later write of the same call wins. done
// runs on the writer goroutine, after the commit, so it must not block; when
// the write is refused up front (invalid call, closed store) it runs before
// SaveCallAsync returns. done may be nil.
func (s *Store) SaveCallAsync(c store.Call, done func(error)) {
	c, done, ok := store.PrepareCallWrite(c, done, s.now)
	if !ok {
		return
	}
	cw := callWrite{key: []byte(c.ID), final: c.State.Done(), finished: c.Finished, done: done}
	if c.IdempotencyKey != "" {
		cw.idem = store.IdempotencyIndexKey(c.TeamID, c.IdempotencyKey)
	}
	v, err := json.Marshal(c)
	if err != nil {
		done(fmt.Errorf("save call %s: encode: %w", c.ID, err))
		return
	}
	cw.value = v
	if cw.deliveries = store.DeliveriesFor(c, s.now().UTC()); len(cw.deliveries) > 0 {
		if cw.encodedDeliveries, err = encodeDeliveries(cw.deliveries); err != nil {
			done(fmt.Errorf("save call %s: encode deliveries: %w", c.ID, err))
			return
		}
	}
	if !s.w.enqueue(cw) {
		done(fmt.Errorf("save call %s: %w", c.ID, store.ErrClosed))
	}
}

func wrapSaveErr(err error) error { return fmt.Errorf("save calls: %w", err) }

// applyCallWrite writes one call and keeps the call indexes in step (see
// schema.go): callpending holds the call iff it is not final; callfinished
// and callexpiry hold it iff it is final, under its current Finished time;
// callidem points at it when it has an idempotency key.
func applyCallWrite(tx *bbolt.Tx, cw *callWrite) error {
	if cw.idem != nil {
		if err := tx.Bucket(bucketCallIdem).Put(cw.idem, cw.key); err != nil {
			return err
		}
		if err := tx.Bucket(bucketCallIdemOf).Put(cw.key, cw.idem); err != nil {
			return err
		}
	}
	calls := tx.Bucket(bucketCalls)
	finished := tx.Bucket(bucketCallFinished)
	expiry := tx.Bucket(bucketCallExpiry)
	pending := tx.Bucket(bucketCallPending)
	calls.FillPercent, finished.FillPercent, expiry.FillPercent = appendFill, appendFill, appendFill
	if old := finished.Get(cw.key); old != nil {
		if err := expiry.Delete(expiryKey(old, cw.key)); err != nil {
			return err
		}
	}
	if err := calls.Put(cw.key, cw.value); err != nil {
		return err
	}
	if err := queueDeliveries(tx, cw); err != nil {
		return err
	}
	if !cw.final {
		if err := finished.Delete(cw.key); err != nil {
			return err
		}
		return pending.Put(cw.key, []byte{})
	}
	if err := pending.Delete(cw.key); err != nil {
		return err
	}
	ts := nanosKey(cw.finished)
	if err := finished.Put(cw.key, ts); err != nil {
		return err
	}
	return expiry.Put(expiryKey(ts, cw.key), []byte{})
}

// appendFill is how full bbolt packs a page it splits, for the call buckets
// whose keys grow with time (call IDs are UUIDv7, expiry keys start with the
// finish time). New keys land at the end, so the left half of a split is
// never written again: bbolt's default of 50% would leave every page half
// empty for good, and each commit would write twice the pages.
const appendFill = 0.95

// expiryKey is the callexpiry key: 8-byte finish time, then the call id.
func expiryKey(ts, id []byte) []byte {
	k := make([]byte, 0, len(ts)+len(id))
	return append(append(k, ts...), id...)
}

// GetCall returns the committed state of a call, or ErrNotFound.
func (s *Store) GetCall(id string) (store.Call, error) {
	var (
		c     store.Call
		found bool
	)
	err := s.view(func(tx *bbolt.Tx) error {
		v := tx.Bucket(bucketCalls).Get([]byte(id))
		if v == nil {
			return nil
		}
		found = true
		return json.Unmarshal(v, &c)
	})
	if err == nil && !found {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Call{}, fmt.Errorf("get call %s: %w", id, err)
	}
	return c, nil
}

// deleteIdem drops call id's idempotency index entries: its callidemof
// entry, and the callidem entry it names while that still points at id.
func deleteIdem(tx *bbolt.Tx, id []byte) error {
	of := tx.Bucket(bucketCallIdemOf)
	ik := of.Get(id)
	if ik == nil {
		return nil
	}
	idem := tx.Bucket(bucketCallIdem)
	if bytes.Equal(idem.Get(ik), id) {
		if err := idem.Delete(ik); err != nil {
			return err
		}
	}
	return of.Delete(id)
}

// CallByIdempotencyKey returns the call that team teamID started with
// idempotency key key, or ErrNotFound.
func (s *Store) CallByIdempotencyKey(teamID, key string) (store.Call, error) {
	var id []byte
	err := s.view(func(tx *bbolt.Tx) error {
		id = slices.Clone(tx.Bucket(bucketCallIdem).Get(store.IdempotencyIndexKey(teamID, key)))
		return nil
	})
	if err != nil {
		return store.Call{}, fmt.Errorf("call by idempotency key: %w", err)
	}
	if id == nil {
		return store.Call{}, fmt.Errorf("call by idempotency key: %w", store.ErrNotFound)
	}
	return s.GetCall(string(id))
}

// PendingCalls returns every call not in a final state (queued or running),
// oldest first. The scheduler calls it at start-up to recover them.
func (s *Store) PendingCalls() ([]store.Call, error) {
	var calls []store.Call
	err := s.view(func(tx *bbolt.Tx) error {
		b := tx.Bucket(bucketCalls)
		// Call ids are UUIDv7: key order is creation order.
		return tx.Bucket(bucketCallPending).ForEach(func(id, _ []byte) error {
			// Either failure means damage inside a page (checkTree sees the
			// pages, not what they hold): the calls cannot be recovered.
			v := b.Get(id)
			if v == nil {
				return corruptError(s.path, fmt.Sprintf("pending call %q has no record", id))
			}
			var c store.Call
			if err := json.Unmarshal(v, &c); err != nil {
				return corruptError(s.path, fmt.Errorf("call %q: %w", id, err))
			}
			calls = append(calls, c)
			return nil
		})
	})
	if err != nil {
		return nil, fmt.Errorf("pending calls: %w", err)
	}
	return calls, nil
}

// expireChunk bounds the calls deleted per write transaction, so expiry never
// holds the one write lock long enough to stall the call writer.
const expireChunk = 1000

// ExpireCalls deletes the finished calls whose Finished is before
// finishedBefore and returns how many it deleted. It works through the
// expiry index in transactions of at most expireChunk calls.
func (s *Store) ExpireCalls(finishedBefore time.Time) (int, error) {
	limit := binary.BigEndian.Uint64(nanosKey(finishedBefore))
	total := 0
	for {
		n := 0
		err := s.update(func(tx *bbolt.Tx) error {
			calls := tx.Bucket(bucketCalls)
			finished := tx.Bucket(bucketCallFinished)
			expiry := tx.Bucket(bucketCallExpiry)
			// Collect first: deleting under a live bbolt cursor skips keys.
			var keys [][]byte
			c := expiry.Cursor()
			for k, _ := c.First(); k != nil && len(keys) < expireChunk; k, _ = c.Next() {
				if len(k) < 8 || binary.BigEndian.Uint64(k[:8]) >= limit {
					break
				}
				keys = append(keys, append([]byte(nil), k...))
			}
			for _, k := range keys {
				id := k[8:]
				if err := deleteIdem(tx, id); err != nil {
					return err
				}
				if err := calls.Delete(id); err != nil {
					return err
				}
				if err := finished.Delete(id); err != nil {
					return err
				}
				if err := expiry.Delete(k); err != nil {
					return err
				}
			}
			n = len(keys)
			if n < expireChunk {
				return expireEnded(tx, limit)
			}
			return nil
		})
		if err != nil {
			return total, fmt.Errorf("expire calls: %w", err)
		}
		total += n
		if n < expireChunk {
			return total, nil
		}
	}
}

// RunSweeper deletes finished calls older than ttl now and then every
// `every`, until ctx ends (see store.RunSweeper), on the store's clock.
func (s *Store) RunSweeper(ctx context.Context, ttl, every time.Duration) error {
	return store.RunSweeper(ctx, s, s.now, ttl, every)
}
