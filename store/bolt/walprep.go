package bolt

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Segments are made ahead of need, filled with zeros and synced, so that an
// append overwrites blocks the file already has, within a size that does not
// change: its fdatasync then writes the records' pages and no inode update
// (ext4 journals a size change with every sync of a growing file). Measured
// on the shared box (BenchmarkWALAppendZeroedVsGrowing, interleaved): see
// docs/benchmarks.md.
//
// A prepared segment has the name it will keep and an all-zero header, which
// readSegment already takes for "nothing was written to it": a daemon killed
// before it was used leaves nothing to replay, and Open removes it with the
// rest of the log. The writer writes the header (one fdatasync, no size
// change) when it moves into the segment, because only then is its first LSN
// known. A zero tail after the last record is not a record: its length is 0,
// and readSegment stops there as at any record cut short.
//
// One segment is prepared at a time, by a goroutine the wal starts
// (prepareNext) and always collects (takePrepared, or close, which stops it
// early): it ends after one send on a buffered channel. The writer asks for
// the next one when the current is half used, so a store with little traffic
// holds one segment, and a busy one finds the next ready; if it is not, the
// writer waits for it. Where a segment cannot be prepared (a full disk), the
// writer makes one as before, growing as it is appended to.

// prepChunk is how much of a segment one write zeroes.
const prepChunk = 1 << 20

// preparedSegment is a zero-filled segment file, open, or why it could not
// be made.
type preparedSegment struct {
	seq  uint64
	f    *os.File
	size int64
	err  error
}

// preparing is one segment being prepared: its result arrives on result;
// stop asks the goroutine to give up (at Close).
type preparing struct {
	result chan preparedSegment // cap 1: the goroutine never blocks
	stop   atomic.Bool
}

// prepareNext starts preparing the segment after the current one. Writer
// goroutine only (or before it starts); none may be in progress.
func (w *wal) prepareNext() {
	p := &preparing{result: make(chan preparedSegment, 1)}
	seq := w.nextSeq
	// A number is never tried twice (see newSegment).
	w.nextSeq++
	w.prep = p
	go func() { p.result <- prepareSegment(w.path, seq, walSegmentSize, &p.stop) }()
}

// takePrepared waits for the segment being prepared, if one is, and returns
// it; ok is false when none was asked for or it could not be made.
func (w *wal) takePrepared() (seg preparedSegment, ok bool) {
	if w.prep == nil {
		return seg, false
	}
	seg = <-w.prep.result
	w.prep = nil
	return seg, seg.err == nil
}

// dropPrepared stops and collects the segment being prepared and removes
// it: it holds nothing.
func (w *wal) dropPrepared() {
	if w.prep == nil {
		return
	}
	w.prep.stop.Store(true)
	if seg, ok := w.takePrepared(); ok {
		seg.f.Close()
		_ = os.Remove(segmentPath(w.path, seg.seq)) // a leftover is skipped and removed at the next Open
	}
}

// prepareSegment makes segment seq of the data file at path: size bytes of
// zeros, synced, with its directory entry. A failed or stopped preparation
// leaves no file behind.
func prepareSegment(path string, seq uint64, size int64, stop *atomic.Bool) preparedSegment {
	name := segmentPath(path, seq)
	seg := preparedSegment{seq: seq, size: size}
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		seg.err = fmt.Errorf("prepare write-ahead log segment: %w", err)
		return seg
	}
	zeros := make([]byte, prepChunk)
	for off := int64(0); off < size && err == nil; off += prepChunk {
		if stop.Load() {
			err = errPrepStopped
			break
		}
		_, err = f.Write(zeros[:min(prepChunk, size-off)])
	}
	if err == nil {
		err = unix.Fdatasync(int(f.Fd()))
	}
	if err == nil {
		err = syncDir(filepath.Dir(path))
	}
	if err != nil {
		f.Close()
		os.Remove(name)
		seg.err = fmt.Errorf("prepare write-ahead log segment: %w", err)
		return seg
	}
	seg.f = f
	return seg
}

var errPrepStopped = errors.New("stopped: the store is closing")
