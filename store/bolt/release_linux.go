package bolt

import (
	"os"
	"syscall"
	"unsafe"

	bbolt "go.etcd.io/bbolt"
)

// releaseMapped drops the data file's pages from the process's memory map after
// Open. Opening with NoFreelistSync rebuilds the freelist by walking every page of
// the file, which maps all of it: a daemon with 100k stored calls would show the
// whole file (about 130 MB) in its RSS while idle. The pages are clean and stay in
// the page cache; bbolt maps the file read-only and shared, so MADV_DONTNEED loses
// nothing and a later read maps a page again. Only what the daemon then touches
// counts in its RSS. Callers run it before anything else uses db.
func releaseMapped(db *bbolt.DB, path string) {
	fi, err := os.Stat(path)
	if err != nil || fi.Size() == 0 {
		return
	}
	// The mapping is at least the file's size (bbolt maps InitialMmapSize or more,
	// rounded up): releasing the file's length stays within it. No unsafe pointer
	// is made from the address; it goes to the kernel as is. Failure only costs
	// memory, so it is ignored.
	syscall.Syscall(syscall.SYS_MADVISE, db.Info().Data, uintptr(fi.Size()), syscall.MADV_DONTNEED)
}

// releaseRange drops the whole pages inside v, a value bbolt handed out
// from its memory map, from the process's map once the caller has copied it,
// for the same reason as releaseMapped: payloads read one after another (a
// queue of large calls being dispatched) would otherwise stay resident,
// counted in the daemon's RSS, long after they were used. The partial pages
// at either end are kept: they hold other keys that may be in use. It does
// nothing unless v lies inside the file's mapping of tx, a read transaction:
// a write transaction's values may live on the Go heap, which MADV_DONTNEED
// would zero.
func releaseRange(tx *bbolt.Tx, v []byte) {
	if len(v) < 2*int(pageSize) || tx.Writable() {
		return
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(v)))
	end := start + uintptr(len(v))
	data := tx.DB().Info().Data
	if start < data || end > data+uintptr(tx.Size()) {
		return
	}
	first := (start + pageSize - 1) &^ (pageSize - 1)
	last := end &^ (pageSize - 1)
	if last > first {
		syscall.Syscall(syscall.SYS_MADVISE, first, last-first, syscall.MADV_DONTNEED)
	}
}

// pageSize is the OS page size, the unit of madvise.
var pageSize = uintptr(os.Getpagesize())
