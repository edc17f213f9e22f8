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
	cw := callWrite{key: []byte(c.ID), final: c.State.Done(), finished: c.Finished, done: done,
		hasInputs: len(c.Inputs) > 0}
	if row, ok := store.CallUsageRow(c); ok {
		cw.usage = &row
	}
	if c.IdempotencyKey != "" {
		cw.idem = store.IdempotencyIndexKey(c.TeamID, c.IdempotencyKey)
	}
	// The record holds the rest and the small payloads, spliced in as they
	// are; large ones go to their own buckets, never encoded again.
	in, out := c.Inputs, c.Outputs
	c.Inputs, c.Outputs = nil, nil
	v := make([]byte, 0, recordSize+smallLen(in)+smallLen(out))
	v, err := store.AppendRecord(v, c)
	if err == nil {
		v, err = splicePayload(v, "inputs", in, &cw.inputs)
	}
	if err == nil {
		v, err = splicePayload(v, "outputs", out, &cw.outputs)
	}
	if err != nil {
		done(fmt.Errorf("save call %s: encode: %w", c.ID, err))
		return
	}
	cw.value = v
	if len(cw.idem) > bbolt.MaxKeySize || len(cw.value) > bbolt.MaxValueSize {
		// Refused before it is logged: a write bbolt can never take would
		// stop the applier, and every replay, for good.
		done(fmt.Errorf("save call %s: %w", c.ID, store.ValidateIdempotencyKey(c.IdempotencyKey)))
		return
	}
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

// recordSize is room enough for a call record without its payloads, most
// of the time: its buffer is allocated once.
const recordSize = 512

// smallLen is the room a payload p takes in its record: all of it when it
// is small enough to be kept there (plus its field name), else none.
func smallLen(p json.RawMessage) int {
	if len(p) > store.SmallPayload {
		return 0
	}
	return len(p) + len(`,"outputs":`)
}

// splicePayload adds a small payload p to the encoded record rec as field
// name, byte for byte, in rec's own buffer, or hands a large one to *large
// for its bucket.
func splicePayload(rec []byte, name string, p json.RawMessage, large *[]byte) ([]byte, error) {
	switch {
	case len(p) == 0:
		return rec, nil
	case len(p) > store.SmallPayload:
		*large = p
		return rec, nil
	case !json.Valid(p):
		return nil, fmt.Errorf("%s are not valid JSON", name)
	}
	rec = append(rec[:len(rec)-1], ',', '"') // rec ends with '}' after at least one field
	rec = append(rec, name...)
	rec = append(rec, '"', ':')
	rec = append(rec, p...)
	return append(rec, '}'), nil
}

// appendField adds "name":raw to the JSON object rec.
func appendField(rec []byte, name string, raw []byte) []byte {
	out := make([]byte, 0, len(rec)+len(name)+len(raw)+4)
	out = append(out, rec[:len(rec)-1]...) // rec ends with '}'
	if len(rec) > 2 {
		out = append(out, ',')
	}
	out = append(out, '"')
	out = append(out, name...)
	out = append(out, '"', ':')
	out = append(out, raw...)
	return append(out, '}')
}

func wrapSaveErr(err error) error { return fmt.Errorf("save calls: %w", err) }

// applyCallWrite writes one call and keeps the call indexes in step (see
// schema.go): callpending holds the call iff it is not final; callfinished
// and callexpiry hold it iff it is final, under its current Finished time;
// callidem points at it when it has an idempotency key; the first final
// write adds the call's usage to its hour's roll-up. Inputs are replaced
// only by a write that carries some; outputs by every write (see
// store.Calls). A small payload is in the record (cw.value), a large one in
// its bucket.
//
// The usage a first final write adds goes to roll, which the caller writes
// in the same transaction (usageRoll.write); nil writes it at once.
func applyCallWrite(tx *bbolt.Tx, cw *callWrite, roll *usageRoll) error {
	if cw.idem != nil {
		if err := tx.Bucket(bucketCallIdem).Put(cw.idem, cw.key); err != nil {
			return err
		}
		if err := tx.Bucket(bucketCallIdemOf).Put(cw.key, cw.idem); err != nil {
			return err
		}
	}
	calls := tx.Bucket(bucketCalls)
	if cw.hasInputs {
		// For small inputs putPayload only deletes chunks that an earlier
		// write of the same call may have left: as a rule none, and then
		// it reads one key and writes nothing.
		if err := putPayload(tx.Bucket(bucketCallInputs), cw.key, cw.inputs); err != nil {
			return err
		}
	} else if old := calls.Get(cw.key); bytes.Contains(old, []byte(`"inputs":`)) {
		// No inputs given and small ones stored: the record keeps them.
		var o struct {
			Inputs json.RawMessage `json:"inputs"`
		}
		if err := json.Unmarshal(old, &o); err != nil {
			return fmt.Errorf("call %s: %w", cw.key, err)
		}
		if len(o.Inputs) > 0 {
			cw.value = appendField(cw.value, "inputs", o.Inputs)
		}
	}
	if err := putPayload(tx.Bucket(bucketCallOutputs), cw.key, cw.outputs); err != nil {
		return err
	}
	finished := tx.Bucket(bucketCallFinished)
	expiry := tx.Bucket(bucketCallExpiry)
	pending := tx.Bucket(bucketCallPending)
	calls.FillPercent, finished.FillPercent, expiry.FillPercent = appendFill, appendFill, appendFill
	old := finished.Get(cw.key)
	if old != nil {
		if err := expiry.Delete(expiryKey(old, cw.key)); err != nil {
			return err
		}
	}
	if cw.final {
		// Before the record's put: its value is read by addCallUsage.
		if err := roll.addCall(tx, cw, old != nil); err != nil {
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

// GetCall returns the committed state of a call, with its inputs and
// outputs, or ErrNotFound.
func (s *Store) GetCall(id string) (store.Call, error) {
	return s.readCall(id, "get call", true, true)
}

// GetCallResult returns the call without its inputs and with its outputs as
// the raw bytes stored, copied once into a buffer of their size and never
// decoded (see store.Calls). Only the small record is decoded.
func (s *Store) GetCallResult(id string) (store.Call, error) {
	return s.readCall(id, "get call result", false, true)
}

// CallInputs returns the stored inputs of a call (nil when it has none), or
// ErrNotFound.
func (s *Store) CallInputs(id string) (json.RawMessage, error) {
	if l := s.pend.get(id); l != nil {
		c, err := s.readLogged(l, true, false)
		if err != nil {
			return nil, fmt.Errorf("call inputs %s: %w", id, err)
		}
		return c.Inputs, nil
	}
	var in json.RawMessage
	found := false
	err := s.view(func(tx *bbolt.Tx) error {
		key := []byte(id)
		if tx.Bucket(bucketCalls).Get(key) == nil {
			return nil
		}
		found = true
		var c store.Call // small inputs are in the record
		if err := decodeCall(tx.Bucket(bucketCalls).Get(key), &c); err != nil {
			return err
		}
		readPayloads(tx, key, &c, true, false)
		in = c.Inputs
		return nil
	})
	if err == nil && !found {
		err = store.ErrNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("call inputs %s: %w", id, err)
	}
	return in, nil
}

// readCall reads call id's record and the payloads asked for, in one read
// transaction, so that they belong to the same commit; or, while its latest
// write is logged and not yet applied, from that write. InputBytes is set
// when the inputs are left out.
func (s *Store) readCall(id, what string, inputs, outputs bool) (store.Call, error) {
	if l := s.pend.get(id); l != nil { // its latest write is the truth
		c, err := s.readLogged(l, inputs, outputs)
		if err != nil {
			return store.Call{}, fmt.Errorf("%s %s: %w", what, id, err)
		}
		return c, nil
	}
	var (
		c     store.Call
		found bool
	)
	err := s.view(func(tx *bbolt.Tx) error {
		key := []byte(id)
		v := tx.Bucket(bucketCalls).Get(key)
		if v == nil {
			return nil
		}
		found = true
		if err := decodeCall(v, &c); err != nil {
			return err
		}
		readPayloads(tx, key, &c, inputs, outputs)
		return nil
	})
	if err == nil && !found {
		err = store.ErrNotFound
	}
	if err != nil {
		return store.Call{}, fmt.Errorf("%s %s: %w", what, id, err)
	}
	return c, nil
}

// readPayloads fills in c's inputs and outputs, or leaves them out
// (InputBytes then says the inputs' size). decodeCall has read the small
// ones from the record; the large ones are in their buckets. A file of
// schema version 1, opened read-only and so not migrated, has no payload
// buckets: its records hold every payload.
func readPayloads(tx *bbolt.Tx, key []byte, c *store.Call, inputs, outputs bool) {
	if b := tx.Bucket(bucketCallInputs); len(c.Inputs) == 0 && b != nil {
		if inputs {
			c.Inputs = readPayload(tx, b, key)
		} else {
			c.InputBytes = payloadSize(b, key)
		}
	} else {
		c.InputBytes = int64(len(c.Inputs))
	}
	if !inputs {
		c.Inputs = nil
	}
	if b := tx.Bucket(bucketCallOutputs); len(c.Outputs) == 0 && b != nil && outputs {
		c.Outputs = readPayload(tx, b, key)
	}
	if !outputs {
		c.Outputs = nil
	}
}

// decodeCall decodes a call record, with the payloads it holds: the small
// ones since schema version 2 (see SaveCallAsync), all of them before.
func decodeCall(v []byte, c *store.Call) error {
	if err := json.Unmarshal(v, c); err != nil {
		return fmt.Errorf("decode call: %w", err)
	}
	return nil
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
// idempotency key key, as GetCallResult does (no inputs), or ErrNotFound.
func (s *Store) CallByIdempotencyKey(teamID, key string) (store.Call, error) {
	ik := store.IdempotencyIndexKey(teamID, key)
	if id, ok := s.pend.byIdem(ik); ok {
		return s.GetCallResult(id)
	}
	var id []byte
	err := s.view(func(tx *bbolt.Tx) error {
		id = slices.Clone(tx.Bucket(bucketCallIdem).Get(ik))
		return nil
	})
	if err != nil {
		return store.Call{}, fmt.Errorf("call by idempotency key: %w", err)
	}
	if id == nil {
		return store.Call{}, fmt.Errorf("call by idempotency key: %w", store.ErrNotFound)
	}
	return s.GetCallResult(string(id)) // a repeated start answers; its inputs are not needed
}

// PendingCalls returns every call not in a final state (queued or running),
// oldest first, without inputs or outputs (InputBytes says the inputs'
// size). The scheduler calls it at start-up to recover them and reads each
// one's inputs when it dispatches it.
func (s *Store) PendingCalls() ([]store.Call, error) {
	s.pend.flush()
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
			if err := decodeCall(v, &c); err != nil {
				return corruptError(s.path, fmt.Errorf("call %q: %w", id, err))
			}
			readPayloads(tx, id, &c, false, false)
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
	// A logged write applied after the expiry would bring its call back.
	s.pend.flush()
	limit := binary.BigEndian.Uint64(nanosKey(finishedBefore))
	total := 0
	for {
		n := 0
		err := s.update(func(tx *bbolt.Tx) error {
			calls := tx.Bucket(bucketCalls)
			finished := tx.Bucket(bucketCallFinished)
			expiry := tx.Bucket(bucketCallExpiry)
			inputs, outputs := tx.Bucket(bucketCallInputs), tx.Bucket(bucketCallOutputs)
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
				if err := deletePayload(inputs, id); err != nil {
					return err
				}
				if err := deletePayload(outputs, id); err != nil {
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
func (s *Store) RunSweeper(ctx context.Context, ttl, every time.Duration, outages store.Outages) error {
	return store.RunSweeper(ctx, s, s.now, ttl, every, outages)
}
