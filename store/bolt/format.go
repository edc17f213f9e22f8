package bolt

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// bbolt's on-disk meta page, as written by go.etcd.io/bbolt (format version 2).
// Page 0 and page 1 each hold one; a page starts with a 16-byte header and the
// meta follows it. Field offsets within the meta (native byte order):
//
//	0 magic u32, 4 version u32, 8 pageSize u32, 12 flags u32,
//	16 root pgid u64, 24 root sequence u64, 32 freelist pgid u64,
//	40 high-water pgid u64, 48 txid u64, 56 checksum u64 (FNV-64a of bytes 0..55).
const (
	boltMagic         = 0xED0CDAED
	boltVersion       = 2
	boltPageHeader    = 16
	boltMetaSize      = 64
	boltNoFreelist    = ^uint64(0)
	boltDefaultPageSz = 4096
)

type boltMeta struct {
	pageSize uint32
	root     uint64
	freelist uint64
	pgid     uint64
	txid     uint64
}

// checkDataFile inspects an existing data file before bbolt maps it.
//
// Why: bbolt trusts its meta page. On a truncated file it maps pages past the
// end of the file, and the first touch of one (bbolt rebuilds the freelist
// by walking every page at open, in a goroutine of its own) kills the process
// with SIGBUS, which no recover can catch. So we check here, holding a shared
// lock so a running daemon's writes cannot race the check, that one meta page
// is valid and that the file holds every page below its high-water mark.
// A missing or empty file passes: bbolt initialises it.
func checkDataFile(path string, timeout time.Duration) error {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("open data file %s: %w", path, err)
	}
	defer f.Close()
	if err := lockShared(f, timeout); err != nil {
		if errors.Is(err, errLockTimeout) {
			return inUseError(path)
		}
		return fmt.Errorf("lock data file %s: %w", path, err)
	}
	fi, err := f.Stat()
	if err != nil {
		return fmt.Errorf("stat data file %s: %w", path, err)
	}
	if fi.IsDir() {
		return fmt.Errorf("data file %s is a directory", path)
	}
	size := fi.Size()
	if size == 0 {
		return nil
	}
	m, err := readBoltMeta(f, size)
	if err != nil {
		return corruptError(path, err)
	}
	if need := m.pgid * uint64(m.pageSize); need > uint64(size) {
		return corruptError(path, fmt.Errorf("file is truncated: %d bytes, its pages need %d", size, need))
	}
	if m.root >= m.pgid {
		return corruptError(path, fmt.Errorf("root page %d beyond high-water mark %d", m.root, m.pgid))
	}
	if m.freelist != boltNoFreelist && m.freelist >= m.pgid {
		return corruptError(path, fmt.Errorf("freelist page %d beyond high-water mark %d", m.freelist, m.pgid))
	}
	return nil
}

// readBoltMeta returns the valid meta page with the highest txid, the one
// bbolt would use.
func readBoltMeta(r io.ReaderAt, size int64) (boltMeta, error) {
	m0, err0 := readMetaAt(r, size, boltPageHeader)
	var m1 boltMeta
	var err1 error
	if err0 == nil {
		m1, err1 = readMetaAt(r, size, int64(m0.pageSize)+boltPageHeader)
	} else {
		m1, err1 = findSecondMeta(r, size)
	}
	switch {
	case err0 != nil && err1 != nil:
		return boltMeta{}, fmt.Errorf("no valid bbolt meta page (page 0: %v; page 1: %v)", err0, err1)
	case err0 != nil:
		return m1, nil
	case err1 != nil:
		return m0, nil
	case m1.txid > m0.txid:
		return m1, nil
	}
	return m0, nil
}

// findSecondMeta finds meta page 1 when page 0, which gives the page size,
// is unreadable (a meta write torn by a power cut). A file's page size is
// the OS page size where it was created: 4 KiB, but 16 or 64 KiB on some
// arm64 kernels. Like bbolt, which then opens from page 1, it tries every
// page size from 1 KiB to 16 MiB; the error is the one at 4 KiB.
func findSecondMeta(r io.ReaderAt, size int64) (boltMeta, error) {
	err := fmt.Errorf("file too short (%d bytes)", size)
	for shift := 0; shift <= 14; shift++ {
		pos := int64(1024) << shift
		if pos >= size-1024 {
			break
		}
		m, e := readMetaAt(r, size, pos+boltPageHeader)
		if e == nil {
			return m, nil
		}
		if pos == boltDefaultPageSz {
			err = e
		}
	}
	return boltMeta{}, err
}

func readMetaAt(r io.ReaderAt, size, off int64) (boltMeta, error) {
	if off+boltMetaSize > size {
		return boltMeta{}, fmt.Errorf("file too short (%d bytes)", size)
	}
	var b [boltMetaSize]byte
	if _, err := r.ReadAt(b[:], off); err != nil {
		return boltMeta{}, fmt.Errorf("read: %w", err)
	}
	le := binary.NativeEndian
	if le.Uint32(b[0:]) != boltMagic {
		return boltMeta{}, errors.New("not a bbolt file (bad magic)")
	}
	if v := le.Uint32(b[4:]); v != boltVersion {
		return boltMeta{}, fmt.Errorf("unsupported bbolt format version %d", v)
	}
	h := fnv.New64a()
	_, _ = h.Write(b[:56])
	if h.Sum64() != le.Uint64(b[56:]) {
		return boltMeta{}, errors.New("meta checksum mismatch")
	}
	m := boltMeta{
		pageSize: le.Uint32(b[8:]),
		root:     le.Uint64(b[16:]),
		freelist: le.Uint64(b[32:]),
		pgid:     le.Uint64(b[40:]),
		txid:     le.Uint64(b[48:]),
	}
	if m.pageSize < 512 || m.pageSize > 1<<20 || m.pageSize&(m.pageSize-1) != 0 {
		return boltMeta{}, fmt.Errorf("implausible page size %d", m.pageSize)
	}
	if m.pgid < 2 {
		return boltMeta{}, fmt.Errorf("implausible high-water mark %d", m.pgid)
	}
	return m, nil
}

var errLockTimeout = errors.New("lock timeout")

// lockShared takes a shared flock on f, retrying until timeout like bbolt's
// own lock. It conflicts with the exclusive lock a running daemon holds. The
// lock goes away when f is closed.
func lockShared(f *os.File, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_SH|syscall.LOCK_NB)
		if err == nil {
			return nil
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) {
			return err
		}
		if time.Now().After(deadline) {
			return errLockTimeout
		}
		time.Sleep(50 * time.Millisecond) // polling, as bbolt does: flock has no timed wait
	}
}
