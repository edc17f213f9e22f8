package bolt

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
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

// appendWALWrite appends cw's encoding to buf.
func appendWALWrite(buf []byte, cw *callWrite) []byte {
	var flags byte
	if cw.hasInputs {
		flags |= walHasInputs
	}
	if cw.final {
		flags |= walFinal
	}
	buf = append(buf, flags)
	var nanos int64
	if !cw.finished.IsZero() {
		nanos = cw.finished.UnixNano()
	}
	buf = binary.AppendVarint(buf, nanos)
	for _, b := range [][]byte{cw.key, cw.value, cw.idem, cw.inputs, cw.outputs} {
		buf = appendBytes(buf, b)
	}
	buf = binary.AppendUvarint(buf, uint64(len(cw.encodedDeliveries)))
	for _, d := range cw.encodedDeliveries {
		buf = appendBytes(buf, d)
	}
	return buf
}

func appendBytes(buf, b []byte) []byte {
	return append(binary.AppendUvarint(buf, uint64(len(b))), b...)
}

// walWriteSize bounds the encoding's length, for sizing the buffer.
func walWriteSize(cw *callWrite) int {
	n := 1 + binary.MaxVarintLen64 + 6*binary.MaxVarintLen64 +
		len(cw.key) + len(cw.value) + len(cw.idem) + len(cw.inputs) + len(cw.outputs)
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
