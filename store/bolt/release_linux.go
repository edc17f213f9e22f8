package bolt

import (
	"os"
	"syscall"

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
