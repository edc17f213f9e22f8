package bolt

import (
	"bytes"
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
// is valid, that the file holds every page below its high-water mark, and
// (checkTree) that every page bbolt will read is well formed.
// A missing file passes: it is a fresh install, and Open creates it.
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
		// Open creates a new file whole (createDataFile): an empty one was
		// emptied since.
		return corruptError(path, "the file is empty (0 bytes)")
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
	if err := checkTree(f, m); err != nil {
		return corruptError(path, err)
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

// bbolt's B+tree pages (go.etcd.io/bbolt internal/common/page.go). A page is
// pageSize × (1 + overflow) bytes and starts with a 16-byte header (native
// byte order):
//
//	0 id u64, 8 flags u16, 10 count u16, 12 overflow u32
//
// followed by count 16-byte elements. A branch element is pos u32, ksize u32,
// child pgid u64; a leaf element is flags u32, pos u32, ksize u32, vsize u32,
// where pos counts from the element's own first byte and the value follows
// the key. A leaf element with flag 1 is a bucket: its value is the bucket's
// root pgid u64 and sequence u64, and a root of 0 means an inline bucket
// whose one leaf page follows in the value. A freelist page holds count page
// ids (u64), or, when count is 0xFFFF, a u64 count and then the ids.
const (
	boltBranchPage   = 0x01
	boltLeafPage     = 0x02
	boltFreelistPage = 0x10
	boltElemSize     = 16
	boltBucketLeaf   = 0x01
	boltBucketHeader = 16
	// maxTreeDepth bounds the walk: bbolt's trees are a few levels deep even
	// with millions of keys, and buckets here nest two levels. Deeper means
	// pages that point at each other in a way no commit writes.
	maxTreeDepth = 64
	// pageReadAhead is how much of a page checkTree reads at once: all of a
	// small page, only the start of one that holds a large value.
	pageReadAhead = 1 << 20
)

// checkTree walks every page reachable from the root bucket of m, reading the
// file through r (never through a memory map), and checks what bbolt takes on
// trust when it reads those pages: each page lies below the high-water mark
// and says it is the page its parent named, of the type its parent expects;
// no page is reached twice (a cycle) or is also in the freelist; every element
// and key lies inside its page; keys are in order within a page and within
// the range their parent gives them, exactly as bbolt's Tx.Check wants.
//
// Why: bbolt does not bounds-check what it reads from its map, and Open
// rebuilds the freelist by walking every page in a goroutine of its own
// (db.freepages): a flipped byte in a leaf's element table or in a branch's
// child id panics there, out of reach of any recover, and a branch pointing
// back at an ancestor would recurse until the stack overflows, a fatal
// error. A file that passes here gives that walk nothing to panic about.
//
// It reads each page's first MiB and the keys, not the large values that
// overflow a page, so its cost grows with the number of stored records, not
// with their size.
func checkTree(r io.ReaderAt, m boltMeta) error {
	w := &treeWalk{r: r, psz: uint64(m.pageSize), hwm: m.pgid, reached: make([]uint64, (m.pgid+63)/64)}
	w.reach(0) // the meta pages
	w.reach(1)
	if m.freelist != boltNoFreelist {
		if err := w.freelist(m.freelist); err != nil {
			return err
		}
	}
	_, err := w.tree(m.root, nil, nil, 0)
	return err
}

// treeWalk is checkTree's state: the pages reached so far, one bit per page
// below the high-water mark, and the pages the freelist page lists.
type treeWalk struct {
	r       io.ReaderAt
	psz     uint64
	hwm     uint64
	reached []uint64
	freed   map[uint64]bool
}

func (w *treeWalk) reach(id uint64) bool {
	was := w.reached[id/64]&(1<<(id%64)) != 0
	w.reached[id/64] |= 1 << (id % 64)
	return was
}

// boltPage is the start of one page as checkTree read it.
type boltPage struct {
	id    uint64
	flags uint16
	count uint64
	size  uint64 // bytes, overflow pages included
	head  []byte // the first min(size, pageReadAhead) bytes
}

// page reads page id, checks its header and marks it and its overflow pages
// reached.
func (w *treeWalk) page(id uint64) (boltPage, error) {
	if id < 2 || id >= w.hwm {
		return boltPage{}, fmt.Errorf("page %d: out of range [2, %d)", id, w.hwm)
	}
	first := make([]byte, boltPageHeader)
	if _, err := w.r.ReadAt(first, int64(id*w.psz)); err != nil {
		return boltPage{}, fmt.Errorf("page %d: read: %w", id, err)
	}
	le := binary.NativeEndian
	if self := le.Uint64(first); self != id {
		return boltPage{}, fmt.Errorf("page %d: its header says it is page %d", id, self)
	}
	overflow := uint64(le.Uint32(first[12:]))
	if overflow >= w.hwm-id {
		return boltPage{}, fmt.Errorf("page %d: its %d overflow pages run past the high-water mark %d", id, overflow, w.hwm)
	}
	for i := id; i <= id+overflow; i++ {
		if w.reach(i) {
			return boltPage{}, fmt.Errorf("page %d: referenced twice", i)
		}
		if w.freed[i] {
			return boltPage{}, fmt.Errorf("page %d: in use and in the freelist", i)
		}
	}
	p := boltPage{id: id, flags: le.Uint16(first[8:]), count: uint64(le.Uint16(first[10:])), size: (1 + overflow) * w.psz}
	p.head = make([]byte, min(p.size, pageReadAhead))
	if _, err := w.r.ReadAt(p.head, int64(id*w.psz)); err != nil {
		return boltPage{}, fmt.Errorf("page %d: read: %w", id, err)
	}
	return p, nil
}

// bytes returns n bytes at off in page p, or an error if they are not all
// inside it.
func (w *treeWalk) bytes(p boltPage, off, n uint64) ([]byte, error) {
	if off > p.size || n > p.size-off {
		return nil, fmt.Errorf("page %d: %d bytes at offset %d lie outside its %d bytes", p.id, n, off, p.size)
	}
	if off+n <= uint64(len(p.head)) {
		return p.head[off : off+n], nil
	}
	b := make([]byte, n)
	if _, err := w.r.ReadAt(b, int64(p.id*w.psz+off)); err != nil {
		return nil, fmt.Errorf("page %d: read: %w", p.id, err)
	}
	return b, nil
}

// tree checks the branch or leaf page id and the pages below it, whose keys
// must lie in [minKey, maxKey) (nil: unbounded), and returns the largest key
// under it, as bbolt's recursivelyCheckPageKeyOrderInternal does.
func (w *treeWalk) tree(id uint64, minKey, maxKey []byte, depth int) ([]byte, error) {
	if depth > maxTreeDepth {
		return nil, fmt.Errorf("page %d: more than %d levels deep", id, maxTreeDepth)
	}
	p, err := w.page(id)
	if err != nil {
		return nil, err
	}
	elems, err := w.bytes(p, boltPageHeader, p.count*boltElemSize)
	if err != nil {
		return nil, err
	}
	le := binary.NativeEndian
	switch p.flags {
	case boltBranchPage:
		if p.count == 0 {
			return nil, fmt.Errorf("page %d: branch page without elements", id)
		}
		keys := make([][]byte, p.count)
		for i := range p.count {
			e := elems[i*boltElemSize:]
			at := boltPageHeader + i*boltElemSize + uint64(le.Uint32(e))
			if keys[i], err = w.bytes(p, at, uint64(le.Uint32(e[4:]))); err != nil {
				return nil, err
			}
		}
		var maxInTree []byte
		running := minKey
		for i := range p.count {
			if err := keyInOrder(id, i, keys[i], running, maxKey); err != nil {
				return nil, err
			}
			next := maxKey
			if i+1 < p.count {
				next = keys[i+1]
			}
			child := le.Uint64(elems[i*boltElemSize+8:])
			if maxInTree, err = w.tree(child, keys[i], next, depth+1); err != nil {
				return nil, err
			}
			running = maxInTree
		}
		return maxInTree, nil
	case boltLeafPage:
		running := minKey
		for i := range p.count {
			e := elems[i*boltElemSize:]
			flags := le.Uint32(e)
			at := boltPageHeader + i*boltElemSize + uint64(le.Uint32(e[4:]))
			ksize, vsize := uint64(le.Uint32(e[8:])), uint64(le.Uint32(e[12:]))
			if _, err := w.bytes(p, at, ksize+vsize); err != nil {
				return nil, err
			}
			key, err := w.bytes(p, at, ksize)
			if err != nil {
				return nil, err
			}
			if err := keyInOrder(id, i, key, running, maxKey); err != nil {
				return nil, err
			}
			running = key
			switch flags {
			case 0:
			case boltBucketLeaf:
				if err := w.bucket(p, at+ksize, vsize, depth); err != nil {
					return nil, err
				}
			default:
				return nil, fmt.Errorf("page %d: element %d has unknown flags %#x", id, i, flags)
			}
		}
		if p.count == 0 {
			return nil, nil
		}
		return running, nil
	}
	return nil, fmt.Errorf("page %d: flags %#x where a branch or leaf page belongs", id, p.flags)
}

// keyInOrder is bbolt's verifyKeyOrder: the first key of a page is at least
// the one its parent gives (prev), each later key is above the one before it,
// and every key is below the parent's next key.
func keyInOrder(id, i uint64, key, prev, maxKey []byte) error {
	switch {
	case i == 0 && prev != nil && bytes.Compare(prev, key) > 0,
		i > 0 && bytes.Compare(prev, key) >= 0,
		maxKey != nil && bytes.Compare(key, maxKey) >= 0:
		return fmt.Errorf("page %d: key %d out of order", id, i)
	}
	return nil
}

// bucket checks the bucket whose value lies at off in page p: a root page
// walked like any other, or an inline bucket, one leaf page inside the value
// with no buckets of its own (bbolt inlines only such buckets).
func (w *treeWalk) bucket(p boltPage, off, vsize uint64, depth int) error {
	if vsize < boltBucketHeader {
		return fmt.Errorf("page %d: bucket value of %d bytes", p.id, vsize)
	}
	v, err := w.bytes(p, off, vsize)
	if err != nil {
		return err
	}
	le := binary.NativeEndian
	if root := le.Uint64(v); root != 0 {
		_, err := w.tree(root, nil, nil, depth+1)
		return err
	}
	in := v[boltBucketHeader:]
	if len(in) < boltPageHeader || le.Uint16(in[8:]) != boltLeafPage {
		return fmt.Errorf("page %d: inline bucket without a leaf page", p.id)
	}
	count := uint64(le.Uint16(in[10:]))
	if count*boltElemSize > uint64(len(in))-boltPageHeader {
		return fmt.Errorf("page %d: inline bucket of %d bytes claims %d elements", p.id, len(in), count)
	}
	for i := range count {
		e := in[boltPageHeader+i*boltElemSize:]
		at := boltPageHeader + i*boltElemSize + uint64(le.Uint32(e[4:]))
		n := uint64(le.Uint32(e[8:])) + uint64(le.Uint32(e[12:]))
		if le.Uint32(e) != 0 || at > uint64(len(in)) || n > uint64(len(in))-at {
			return fmt.Errorf("page %d: inline bucket element %d is malformed", p.id, i)
		}
	}
	return nil
}

// freelist reads the freelist page id, which bbolt loads instead of walking
// the tree when a file has one: every id it lists must be a page, once.
func (w *treeWalk) freelist(id uint64) error {
	p, err := w.page(id)
	if err != nil {
		return err
	}
	if p.flags != boltFreelistPage {
		return fmt.Errorf("page %d: flags %#x where the freelist belongs", id, p.flags)
	}
	start, count := uint64(boltPageHeader), p.count
	if count == 0xFFFF {
		b, err := w.bytes(p, start, 8)
		if err != nil {
			return err
		}
		start, count = start+8, binary.NativeEndian.Uint64(b)
	}
	if count > (p.size-start)/8 {
		return fmt.Errorf("page %d: freelist of %d bytes claims %d pages", id, p.size, count)
	}
	ids, err := w.bytes(p, start, count*8)
	if err != nil {
		return err
	}
	w.freed = make(map[uint64]bool, count)
	for i := range count {
		f := binary.NativeEndian.Uint64(ids[i*8:])
		if f < 2 || f >= w.hwm || w.freed[f] {
			return fmt.Errorf("page %d: freelist lists page %d out of range or twice", id, f)
		}
		w.freed[f] = true
	}
	return nil
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
