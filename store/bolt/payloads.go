package bolt

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"

	bbolt "go.etcd.io/bbolt"

	"inferd/store"
)

// payloadChunk is how many bytes of a payload one key of callinputs or
// calloutputs holds.
//
// Why chunks: bbolt keeps a value inline in its leaf, and a leaf holds at
// least two keys, so a multi-megabyte value stored whole shares its leaf
// with its neighbours, and every write to that leaf (the next call's
// payload, appended beside it: ids are time-ordered) copies and rewrites
// them all, reading them through the memory map on the way. In chunks of
// 64 KiB a new payload rewrites at most the last few chunks of the one
// before, and reading one payload touches only its own pages.
const payloadChunk = 64 << 10

// chunkKey is the key of chunk n of call id's payload.
func chunkKey(id []byte, n uint32) []byte {
	k := make([]byte, len(id)+4)
	copy(k, id)
	binary.BigEndian.PutUint32(k[len(id):], n)
	return k
}

// isChunkOf reports whether k is a chunk key of call id: the id, then four
// bytes. Call ids all have the same length, so no other id's chunks match.
func isChunkOf(k, id []byte) bool {
	return len(k) == len(id)+4 && bytes.HasPrefix(k, id)
}

// putPayload replaces call id's payload in b with p, in chunks; an empty p
// leaves none. The chunks refer to p until the transaction commits.
func putPayload(b *bbolt.Bucket, id, p []byte) error {
	if err := deletePayload(b, id); err != nil {
		return err
	}
	b.FillPercent = appendFill
	for n := uint32(0); len(p) > 0; n++ {
		size := min(len(p), payloadChunk)
		if err := b.Put(chunkKey(id, n), p[:size]); err != nil {
			return err
		}
		p = p[size:]
	}
	return nil
}

// deletePayload removes call id's chunks from b.
func deletePayload(b *bbolt.Bucket, id []byte) error {
	// Collect first: deleting under a live bbolt cursor skips keys.
	var keys [][]byte
	c := b.Cursor()
	for k, _ := c.Seek(id); k != nil && isChunkOf(k, id); k, _ = c.Next() {
		keys = append(keys, append([]byte(nil), k...))
	}
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return nil
}

// payloadSize returns the size of call id's payload in b. It reads the
// chunks' lengths, not their bytes.
func payloadSize(b *bbolt.Bucket, id []byte) int64 {
	var n int64
	c := b.Cursor()
	for k, v := c.Seek(id); k != nil && isChunkOf(k, id); k, v = c.Next() {
		n += int64(len(v))
	}
	return n
}

// readPayload returns a copy of call id's payload in b (nil when it has
// none), in one buffer of exactly its size: the one copy a reader holds. The
// pages it read are then dropped from the process's memory map (they stay in
// the page cache), so that reading payloads does not grow the daemon's RSS
// by their size (see releaseRange).
func readPayload(tx *bbolt.Tx, b *bbolt.Bucket, id []byte) json.RawMessage {
	size := payloadSize(b, id)
	if size == 0 {
		return nil
	}
	out := make([]byte, 0, size)
	c := b.Cursor()
	for k, v := c.Seek(id); k != nil && isChunkOf(k, id); k, v = c.Next() {
		out = append(out, v...)
		releaseRange(tx, v)
	}
	return out
}

// splitPayloads is the migration to schema version 2: the large inputs and
// outputs (over store.SmallPayload) leave the call records for callinputs
// and calloutputs.
func splitPayloads(tx *bbolt.Tx) error {
	if err := createBuckets(bucketCallInputs, bucketCallOutputs)(tx); err != nil {
		return err
	}
	calls := tx.Bucket(bucketCalls)
	if calls == nil {
		return fmt.Errorf("no %s bucket", bucketCalls)
	}
	var ids [][]byte
	if err := calls.ForEach(func(k, _ []byte) error {
		ids = append(ids, append([]byte(nil), k...))
		return nil
	}); err != nil {
		return err
	}
	inputs, outputs := tx.Bucket(bucketCallInputs), tx.Bucket(bucketCallOutputs)
	for _, id := range ids {
		var rec map[string]json.RawMessage
		if err := json.Unmarshal(calls.Get(id), &rec); err != nil {
			return fmt.Errorf("decode call %s: %w", id, err)
		}
		// Small payloads stay in the record, as version 2 writes them.
		var in, out json.RawMessage
		if p := rec["inputs"]; len(p) > store.SmallPayload {
			in = p
			delete(rec, "inputs")
		}
		if p := rec["outputs"]; len(p) > store.SmallPayload {
			out = p
			delete(rec, "outputs")
		}
		meta, err := json.Marshal(rec)
		if err != nil {
			return fmt.Errorf("encode call %s: %w", id, err)
		}
		if err := calls.Put(id, meta); err != nil {
			return err
		}
		if err := putPayload(inputs, id, in); err != nil {
			return err
		}
		if err := putPayload(outputs, id, out); err != nil {
			return err
		}
	}
	return nil
}
