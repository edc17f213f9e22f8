package bolt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"time"

	"inferd/store"
)

// A call write as the log holds it: everything applyCallWrite needs, so that
// replaying the record at open applies exactly what the writer would have.
//
//	flags     1 byte: 1 hasInputs, 2 final
//	finished  varint unix nanos (0: none)
//	key, value, idem, inputs, outputs
//	          each a uvarint length and the bytes
//	deliveries uvarint count, then each delivery's JSON as above
const (
	walHasInputs = 1 << iota
	walFinal
)

// walEncoder encodes a group's records for one append (wal.append) as the
// parts the file gets, in order: the small fields encoded into buf, and
// each large payload (inputs or outputs over store.SmallPayload, which a
// write carries apart from its record) referred to where it is, in the
// buffer its caller read it into. A 60 MiB model reply is then written to
// the log from its own buffer rather than copied whole into buf first, a
// copy that was garbage as soon as the append ended (issue 41). The bytes
// are the same either way: replay reads them back as one record.
type walEncoder struct {
	buf   []byte
	parts []walPart
	mark  int      // buf[mark:] is not yet in parts
	vec   [][]byte // what pieces returns, reused
}

// walPart is ext when it is not nil, else buf[start:end].
type walPart struct {
	ext        []byte
	start, end int
}

// reset empties e for the next group, keeping its buffers. It drops the
// references to the last group's payloads.
func (e *walEncoder) reset() {
	clear(e.parts)
	clear(e.vec)
	e.buf, e.parts, e.vec, e.mark = e.buf[:0], e.parts[:0], e.vec[:0], 0
}

// cut ends the part of buf being encoded.
func (e *walEncoder) cut() {
	if len(e.buf) > e.mark {
		e.parts = append(e.parts, walPart{start: e.mark, end: len(e.buf)})
		e.mark = len(e.buf)
	}
}

func (e *walEncoder) bytes(p walPart) []byte {
	if p.ext != nil {
		return p.ext
	}
	return e.buf[p.start:p.end]
}

// record adds cw as the record of LSN lsn: its head (the body's length,
// the CRC of LSN and body, the LSN) and its body.
func (e *walEncoder) record(lsn uint64, cw *callWrite) {
	e.cut() // the record's first part starts with its head
	first, start := len(e.parts), len(e.buf)
	e.buf = slices.Grow(e.buf, walRecordHead+walWriteSize(cw))
	e.buf = e.buf[:start+walRecordHead]
	binary.BigEndian.PutUint64(e.buf[start+8:], lsn)
	e.encode(cw)
	e.cut()
	n, sum := 0, uint32(0)
	for i, p := range e.parts[first:] {
		b := e.bytes(p)
		if i == 0 {
			b = b[8:] // from the LSN on
		}
		n += len(b)
		sum = crc32.Update(sum, castagnoli, b)
	}
	binary.BigEndian.PutUint32(e.buf[start:], uint32(n-8))
	binary.BigEndian.PutUint32(e.buf[start+4:], sum)
}

// encode adds cw's body: its small fields to buf, its large payloads as
// parts of their own.
func (e *walEncoder) encode(cw *callWrite) {
	var flags byte
	if cw.hasInputs {
		flags |= walHasInputs
	}
	if cw.final {
		flags |= walFinal
	}
	e.buf = append(e.buf, flags)
	var nanos int64
	if !cw.finished.IsZero() {
		nanos = cw.finished.UnixNano()
	}
	e.buf = binary.AppendVarint(e.buf, nanos)
	for _, b := range [][]byte{cw.key, cw.value, cw.idem} {
		e.buf = appendBytes(e.buf, b)
	}
	for _, b := range [][]byte{cw.inputs, cw.outputs} {
		if len(b) <= store.SmallPayload {
			e.buf = appendBytes(e.buf, b)
			continue
		}
		e.buf = binary.AppendUvarint(e.buf, uint64(len(b)))
		e.cut()
		e.parts = append(e.parts, walPart{ext: b})
	}
	e.buf = binary.AppendUvarint(e.buf, uint64(len(cw.encodedDeliveries)))
	for _, d := range cw.encodedDeliveries {
		e.buf = appendBytes(e.buf, d)
	}
}

// pieces returns the records added since reset as the slices to write one
// after another (adjacent parts of buf as one) and their total size. Called
// once per group; the slices are valid until the next reset.
func (e *walEncoder) pieces() ([][]byte, int64) {
	e.cut()
	var size int64
	run := -1 // where in buf the run of buf's parts being joined starts; -1: none
	for _, p := range e.parts {
		size += int64(len(e.bytes(p)))
		switch {
		case p.ext != nil:
			e.vec = append(e.vec, p.ext)
			run = -1
		case run >= 0: // parts of buf follow one another in it
			e.vec[len(e.vec)-1] = e.buf[run:p.end]
		default:
			run = p.start
			e.vec = append(e.vec, e.buf[p.start:p.end])
		}
	}
	return e.vec, size
}

func appendBytes(buf, b []byte) []byte {
	return append(binary.AppendUvarint(buf, uint64(len(b))), b...)
}

// walWriteSize bounds the length of cw's encoding in buf: its small
// fields, and its payloads where they are small enough to be copied.
func walWriteSize(cw *callWrite) int {
	n := 1 + binary.MaxVarintLen64 + 6*binary.MaxVarintLen64 +
		len(cw.key) + len(cw.value) + len(cw.idem)
	for _, p := range [][]byte{cw.inputs, cw.outputs} {
		if len(p) <= store.SmallPayload {
			n += len(p)
		}
	}
	for _, d := range cw.encodedDeliveries {
		n += binary.MaxVarintLen64 + len(d)
	}
	return n
}

var errWALRecord = errors.New("malformed call write")

// decodeWALWrite decodes a record appendWALWrite made. The slices it
// returns alias rec.
func decodeWALWrite(rec []byte) (callWrite, error) {
	var cw callWrite
	if len(rec) < 1 {
		return cw, errWALRecord
	}
	flags := rec[0]
	rec = rec[1:]
	cw.hasInputs, cw.final = flags&walHasInputs != 0, flags&walFinal != 0
	nanos, n := binary.Varint(rec)
	if n <= 0 {
		return cw, errWALRecord
	}
	rec = rec[n:]
	if nanos != 0 {
		cw.finished = time.Unix(0, nanos).UTC()
	}
	var err error
	for _, p := range []*[]byte{&cw.key, &cw.value, &cw.idem, &cw.inputs, &cw.outputs} {
		if *p, rec, err = cutBytes(rec); err != nil {
			return cw, err
		}
	}
	count, n := binary.Uvarint(rec)
	if n <= 0 || count > uint64(len(rec)) {
		return cw, errWALRecord
	}
	rec = rec[n:]
	for range count {
		var d []byte
		if d, rec, err = cutBytes(rec); err != nil {
			return cw, err
		}
		var del store.Delivery
		if err := json.Unmarshal(d, &del); err != nil {
			return cw, fmt.Errorf("%w: delivery: %w", errWALRecord, err)
		}
		cw.encodedDeliveries = append(cw.encodedDeliveries, d)
		cw.deliveries = append(cw.deliveries, del)
	}
	if len(rec) != 0 || len(cw.key) == 0 || len(cw.value) == 0 {
		return cw, errWALRecord
	}
	return cw, nil
}

func cutBytes(rec []byte) (b, rest []byte, err error) {
	l, n := binary.Uvarint(rec)
	if n <= 0 || l > uint64(len(rec)-n) {
		return nil, nil, errWALRecord
	}
	rec = rec[n:]
	if l == 0 {
		return nil, rec, nil
	}
	return rec[:l:l], rec[l:], nil
}
