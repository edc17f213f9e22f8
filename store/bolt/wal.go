package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// The write-ahead log of call writes (see writer.go for why). It lives
// beside the data file as segments PATH.wal.NNNNNNNNNN, numbered in the
// order they were made. Each segment is a header and then records:
//
//	header  "inferdWAL" 0x01, 4-byte big-endian SchemaVersion, 8-byte
//	        first LSN, 4-byte CRC-32C of the 24 bytes before it: 28 bytes
//	record  4-byte length of body, 4-byte CRC-32C of LSN and body,
//	        8-byte LSN, body (walrecord.go)
//
// LSNs (log sequence numbers) count call writes from 1, without gaps, across
// segments. A segment's records run from its first LSN on, one after
// another; reading stops at the first record that is cut short, fails its
// CRC or breaks the sequence: a crash in the middle of an append leaves such
// a tail, and nobody was told of the writes in it. A segment whose first LSN
// is not past the records before it replaces them from that LSN on: after a
// failed append the writer starts a new segment, so writes whose append
// failed (and whose callers were told so) never count. The data file keeps
// the LSN of the last write applied to it (meta "walapplied", in the same
// transaction), so replay applies each write once.
//
// All fields are big-endian. Only the writer goroutine appends; the applier
// removes segments it has applied (release), under mu.

const (
	walMagic      = "inferdWAL\x01"
	walHeaderSize = len(walMagic) + 4 + 8 + 4
	walRecordHead = 4 + 4 + 8
	// walSegmentSize is a segment's size, zeros included (walprep.go): a
	// group that would not fit in what is left goes into the next segment,
	// so that applied ones can be removed. A group larger than a whole
	// segment goes alone into one, which grows to hold it.
	walSegmentSize = 8 << 20
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// walSegment is one segment file the log knows of.
type walSegment struct {
	seq      uint64
	firstLSN uint64
	path     string
}

// wal is the open log.
type wal struct {
	path string // the data file's; segments are path.wal.N
	// maxSize, when > 0, caps a segment as a full disk would (tests).
	maxSize int64

	mu   sync.Mutex   // guards segs (the applier releases, the writer appends)
	segs []walSegment // oldest first; the last is cur's, while cur is open

	// Writer goroutine only:
	cur     *os.File // the segment appended to; nil: move to the next at the next append
	off     int64    // where cur's records end
	limit   int64    // cur's size when it was made (zeros); past it the file grows
	nextSeq uint64
	next    uint64     // the LSN of the next write
	prep    *preparing // the next segment, being or already prepared; nil: none asked for
	enc     walEncoder // the records of the group being appended
}

func segmentPath(path string, seq uint64) string {
	return fmt.Sprintf("%s.wal.%010d", path, seq)
}

// WALFiles returns the log segments beside the data file at path, oldest
// first: with the data file they are the data while a daemon runs or after
// one was killed (a clean stop applies and removes them). Moving or copying
// a data file at rest means moving or copying these with it. A segment
// prepared and never begun (walprep.go: zeros, no header) holds nothing and
// is not listed; the next Open removes it.
func WALFiles(path string) ([]string, error) {
	segs, err := listSegments(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, s := range segs {
		if begun(s.path) {
			out = append(out, s.path)
		}
	}
	return out, nil
}

// begun reports whether the segment file at path has a header, or cannot
// be read (then it is listed, to be safe).
func begun(path string) bool {
	f, err := os.Open(path)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	defer f.Close()
	hdr := make([]byte, walHeaderSize)
	n, _ := io.ReadFull(f, hdr)
	return !allZero(hdr[:n])
}

// listSegments finds the segments of the data file at path, by number.
// firstLSN is not read here.
func listSegments(path string) ([]walSegment, error) {
	matches, err := filepath.Glob(globEscape(path) + ".wal.*")
	if err != nil {
		return nil, err
	}
	var segs []walSegment
	for _, m := range matches {
		seq, err := strconv.ParseUint(strings.TrimPrefix(m, path+".wal."), 10, 64)
		if err != nil {
			continue // not ours (an editor's backup, say)
		}
		segs = append(segs, walSegment{seq: seq, path: m})
	}
	slices.SortFunc(segs, func(a, b walSegment) int { return int(a.seq) - int(b.seq) })
	return segs, nil
}

func globEscape(p string) string {
	r := strings.NewReplacer(`\`, `\\`, `*`, `\*`, `?`, `\?`, `[`, `\[`)
	return r.Replace(p)
}

// checkWALVersion refuses a log written by an inferd of another schema
// version before Open migrates anything: replaying it takes the binary that
// wrote it, and a migrated file would no longer open in that one.
func checkWALVersion(path string) error {
	segs, err := listSegments(path)
	if err != nil {
		return fmt.Errorf("list write-ahead log: %w", err)
	}
	for _, s := range segs {
		f, err := os.Open(s.path)
		if err != nil {
			return fmt.Errorf("read write-ahead log: %w", err)
		}
		hdr := make([]byte, walHeaderSize)
		n, _ := io.ReadFull(f, hdr)
		f.Close()
		if n == walHeaderSize && string(hdr[:len(walMagic)]) == walMagic {
			if v := binary.BigEndian.Uint32(hdr[len(walMagic):]); v != SchemaVersion {
				return &openError{
					msg: fmt.Sprintf("write-ahead log %s was written by an inferd of schema version %d (this one: %d): "+
						"start that version once, and stop it, to fold the log into the data file", s.path, v, SchemaVersion),
					kind: ErrSchema,
				}
			}
		}
	}
	return nil
}

// walRecord is one write read back from the log.
type walRecord struct {
	lsn  uint64
	body []byte
}

// readWAL reads the log beside path and returns the writes after applied
// (the LSN the data file says it holds), in order, and the segments found.
// A log that does not continue from applied (its next write is missing) is
// an error: it belongs to another state of the file.
func readWAL(path string, applied uint64) (recs []walRecord, segs []walSegment, last uint64, err error) {
	if segs, err = listSegments(path); err != nil {
		return nil, nil, 0, fmt.Errorf("list write-ahead log: %w", err)
	}
	last = applied
	var all []walRecord
	for i := range segs {
		first, rs, err := readSegment(path, segs[i].path)
		if err != nil {
			return nil, nil, 0, err
		}
		segs[i].firstLSN = first
		if first == 0 {
			continue // its header never made it to disk: nothing was written to it
		}
		// A later segment replaces what an earlier one held from its first
		// LSN on (an append that failed).
		all = slices.DeleteFunc(all, func(r walRecord) bool { return r.lsn >= first })
		all = append(all, rs...)
	}
	want := applied + 1
	for _, r := range all {
		switch {
		case r.lsn < want:
			continue // applied before
		case r.lsn > want:
			return nil, nil, 0, walError(path, fmt.Sprintf("its next write is %d, the data file holds writes up to %d: the log does not continue this data file", r.lsn, want-1))
		}
		recs = append(recs, r)
		want++
	}
	if len(all) > 0 {
		last = max(last, all[len(all)-1].lsn)
	}
	return recs, segs, last, nil
}

// readSegment reads one segment: its first LSN (0 if its header is
// incomplete, or zeros: prepared and never used) and its records up to the
// first that is not whole. The zeros after the last record of a prepared
// segment end it as a record cut short would: a record is never empty.
func readSegment(dataPath, path string) (first uint64, recs []walRecord, err error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, nil, fmt.Errorf("read write-ahead log: %w", err)
	}
	if len(b) < walHeaderSize || allZero(b[:walHeaderSize]) {
		return 0, nil, nil // cut short while it was made: nothing was written to it
	}
	if string(b[:len(walMagic)]) != walMagic ||
		crc32.Checksum(b[:walHeaderSize-4], castagnoli) != binary.BigEndian.Uint32(b[walHeaderSize-4:]) {
		return 0, nil, walError(dataPath, filepath.Base(path)+" is not an inferd write-ahead log segment")
	}
	if v := binary.BigEndian.Uint32(b[len(walMagic):]); v != SchemaVersion {
		return 0, nil, fmt.Errorf("write-ahead log %s was written by an inferd of schema version %d (this one: %d): start that version once to fold it into the data file", path, v, SchemaVersion)
	}
	first = binary.BigEndian.Uint64(b[len(walMagic)+4:])
	want := first
	for rest := b[walHeaderSize:]; len(rest) >= walRecordHead; {
		n := int(binary.BigEndian.Uint32(rest))
		sum := binary.BigEndian.Uint32(rest[4:])
		if n == 0 || n > len(rest)-walRecordHead || crc32.Checksum(rest[8:walRecordHead+n], castagnoli) != sum {
			break
		}
		lsn := binary.BigEndian.Uint64(rest[8:])
		if lsn != want {
			break
		}
		recs = append(recs, walRecord{lsn: lsn, body: rest[walRecordHead : walRecordHead+n]})
		rest = rest[walRecordHead+n:]
		want++
	}
	return first, recs, nil
}

// openWAL prepares the log for appending from LSN next, after the segments
// segs (already applied, kept until removeApplied), and starts preparing the
// first segment it will append to.
func openWAL(path string, segs []walSegment, next uint64, maxSize int64) *wal {
	w := &wal{path: path, maxSize: maxSize, segs: segs, next: next, nextSeq: 1}
	if len(segs) > 0 {
		w.nextSeq = segs[len(segs)-1].seq + 1
	}
	w.prepareNext()
	return w
}

// append writes cws as the next records and makes them durable (one
// fdatasync), and returns the LSN of the first. On failure no LSN is used
// and the segment is left behind: the next append starts a new one, which
// replaces whatever of these records reached the disk.
func (w *wal) append(cws []callWrite) (uint64, error) {
	e := &w.enc
	e.reset()
	defer e.reset() // the payloads are the callers', not the log's to keep
	lsn := w.next
	for i := range cws {
		e.record(lsn+uint64(i), &cws[i])
	}
	pieces, size := e.pieces()
	if cap(e.buf) > 1<<20 {
		e.buf = nil // keep a buffer of an ordinary batch's size, not a huge batch's
	}
	if w.cur != nil && w.off > int64(walHeaderSize) && w.off+size > w.limit {
		w.cur.Close() // durable; the group goes into the next segment
		w.cur = nil
	}
	if w.cur == nil {
		if err := w.nextSegment(); err != nil {
			return 0, err
		}
	}
	if w.maxSize > 0 && w.off+size > w.maxSize {
		return 0, fmt.Errorf("append to write-ahead log: %w", syscall.ENOSPC)
	}
	if err := writePieces(w.cur, pieces, w.off); err != nil {
		w.abandon()
		return 0, fmt.Errorf("append to write-ahead log: %w", err)
	}
	if err := unix.Fdatasync(int(w.cur.Fd())); err != nil {
		w.abandon()
		return 0, fmt.Errorf("sync write-ahead log: %w", err)
	}
	w.off += size
	w.next += uint64(len(cws))
	if w.off >= w.limit {
		w.cur.Close() // durable; the next append starts a new segment
		w.cur = nil
	}
	if w.prep == nil && (w.cur == nil || w.off >= w.limit/2) {
		w.prepareNext()
	}
	return lsn, nil
}

// writePieces writes pieces one after another into f from off. A large
// payload is its own piece, written from its caller's buffer; a crash
// part way leaves a record cut short, as a crash inside one write would.
func writePieces(f *os.File, pieces [][]byte, off int64) error {
	for _, p := range pieces {
		if _, err := f.WriteAt(p, off); err != nil {
			return err
		}
		off += int64(len(p))
	}
	return nil
}

// abandon gives up the current segment after a failed write or sync: its
// tail may hold part of the failed records, so nothing more is appended to
// it, and the next segment starts at the LSN they would have had.
func (w *wal) abandon() {
	w.cur.Close()
	w.cur = nil // the next append makes a new segment
}

// nextSegment moves the writer into the next segment: the prepared one
// (walprep.go), or, where none could be prepared, one made here that grows
// as it is appended to. Its header is durable before any record goes in it.
func (w *wal) nextSegment() error {
	if p, ok := w.takePrepared(); ok {
		return w.begin(p.f, p.seq, p.size, false)
	}
	return w.newSegment()
}

// newSegment makes the next segment as an empty file, durable (file and
// directory entry) before any record goes in it.
func (w *wal) newSegment() error {
	seq := w.nextSeq
	// A number is never tried twice: a failed attempt's file, if it could
	// not be removed, holds no record and is passed over at replay.
	w.nextSeq++
	f, err := os.OpenFile(segmentPath(w.path, seq), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create write-ahead log segment: %w", err)
	}
	return w.begin(f, seq, walSegmentSize, true)
}

// begin writes segment seq's header into f and makes it the one appended
// to, for records up to limit. newDir: f's directory entry is not yet
// durable.
func (w *wal) begin(f *os.File, seq uint64, limit int64, newDir bool) error {
	seg := walSegment{seq: seq, firstLSN: w.next, path: segmentPath(w.path, seq)}
	hdr := make([]byte, 0, walHeaderSize)
	hdr = append(hdr, walMagic...)
	hdr = binary.BigEndian.AppendUint32(hdr, SchemaVersion)
	hdr = binary.BigEndian.AppendUint64(hdr, seg.firstLSN)
	hdr = binary.BigEndian.AppendUint32(hdr, crc32.Checksum(hdr, castagnoli))
	_, err := f.WriteAt(hdr, 0)
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if err == nil && newDir {
		err = syncDir(filepath.Dir(w.path))
	}
	if err != nil {
		f.Close()
		os.Remove(seg.path)
		return fmt.Errorf("create write-ahead log segment: %w", err)
	}
	w.cur, w.off, w.limit = f, int64(walHeaderSize), limit
	w.mu.Lock()
	w.segs = append(w.segs, seg)
	w.mu.Unlock()
	return nil
}

// release removes the segments whose every write is at or before applied
// (the data file holds them). The segment being appended to stays.
func (w *wal) release(applied uint64) {
	w.mu.Lock()
	var drop []walSegment
	for len(w.segs) > 1 && w.segs[1].firstLSN <= applied+1 {
		drop = append(drop, w.segs[0])
		w.segs = w.segs[1:]
	}
	w.mu.Unlock()
	for _, s := range drop {
		// Failing to remove one costs disk space only: replay skips what
		// the data file holds.
		_ = os.Remove(s.path)
	}
}

// close closes the segment being appended to and, when every write is in
// the data file (all), removes every segment, so that a cleanly stopped
// store is its data file alone.
func (w *wal) close(all bool) error {
	w.dropPrepared()
	if w.cur != nil {
		w.cur.Close()
		w.cur = nil
	}
	if !all {
		return nil
	}
	w.mu.Lock()
	segs := w.segs
	w.segs = nil
	w.mu.Unlock()
	return removeSegments(w.path, segs)
}

// removeSegments deletes segs and makes the deletion durable.
func removeSegments(path string, segs []walSegment) error {
	for _, s := range segs {
		if err := os.Remove(s.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove write-ahead log segment: %w", err)
		}
	}
	if len(segs) == 0 {
		return nil
	}
	return syncDir(filepath.Dir(path))
}

// walError is an Open failure caused by the log beside the data file at
// path, an ErrCorrupt.
func walError(path, detail string) error {
	return &openError{
		msg: fmt.Sprintf("write-ahead log of data file %s (%s.wal.*): %s; restore from a backup, or move those files aside "+
			"to open the data file without the writes they hold", path, path, detail),
		kind: ErrCorrupt,
	}
}

func allZero(b []byte) bool {
	for _, c := range b {
		if c != 0 {
			return false
		}
	}
	return true
}
