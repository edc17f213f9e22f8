package bolt

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"runtime/debug"
	"sync"
	"sync/atomic"
	"time"

	bbolt "go.etcd.io/bbolt"
	berrors "go.etcd.io/bbolt/errors"

	"inferd/store"
)

// Defaults for Options and the bbolt file.
const (
	// DefaultTimeout is how long Open waits for another process to release
	// the data file's lock.
	DefaultTimeout = 2 * time.Second
	// initialMmapSize is mapped up front so that read transactions rarely
	// block a commit that must grow the file (bbolt remaps under a lock),
	// and so that such a commit rarely copies what it writes: before a
	// remap bbolt moves every key and value of the transaction's nodes to
	// the heap (node.dereference), a 60 MiB reply's payload included, a
	// copy that is garbage when the commit ends. At 64 MiB a data file
	// growing to 1 GiB remapped five times (issue 41). 1 GiB is address
	// space, not memory: only the pages read count in the RSS
	// (releaseMapped, releaseRange); past it bbolt grows the map 1 GiB at
	// a time.
	initialMmapSize = 1 << 30
)

// Store keeps the contract of store.Store (storetest runs it).
var _ store.Store = (*Store)(nil)

// Options configure Open. The zero value is ready to use.
type Options struct {
	// Timeout is how long Open waits for the file lock held by another
	// process before failing with ErrInUse. Zero means DefaultTimeout.
	Timeout time.Duration
	// Now stamps Created, Updated, Revoked and a final call's missing
	// Finished, and is the sweeper's clock. Nil means time.Now.
	Now func() time.Time

	// ReadOnly opens an existing file without changing it, holding a shared
	// lock (so it fails with ErrInUse while a daemon has the file open): for
	// inspecting a data file or a backup. A file of an older schema opens as
	// it is, unmigrated (see Migration); writes fail.
	ReadOnly bool

	// maxSize caps the file like a full disk would (bbolt's MaxSize); for
	// tests of the storage-full path.
	maxSize int
	// migrations replaces the package's migrations; for tests of the
	// migration machinery with synthetic schema versions.
	migrations []migration
	// applyHook, when set, runs before each attempt to apply logged writes
	// to the data file; an error fails the attempt (tests of a data file
	// that falls behind, fails, or never gets the writes: a crash).
	applyHook func() error
}

// Store is an open data file, a store.Store. Its methods are safe for
// concurrent use.
type Store struct {
	db   *bbolt.DB
	path string
	now  func() time.Time

	w writer // the one group-commit writer for call records
	// log is the write-ahead log the writer appends to (nil when read-only);
	// pend the writes in it not yet applied to db, which runApplier applies.
	log         *wal
	pend        *pending
	applierDone chan struct{} // closed when runApplier returns
	applyHook   func() error  // Options.applyHook

	migration Migration // what Open did to the schema

	hooks store.ProjectHooks
	store.TeamHooks
	deliveryHooks store.DeliveryHooks

	keys keyCache
	// projects caches ProjectByModelKey; every project write resets it.
	projects projectCache
	// summaries caches RecentCalls' decoding of finished calls.
	summaries summaryCache

	commits     atomic.Int64 // group commits made by the writer
	commitWrite atomic.Int64 // call writes in those commits
	commitNanos atomic.Int64 // time spent in those commits

	closeOnce sync.Once
	closeErr  error
}

// Open opens the data file at path, creating it (mode 0600, and its
// directory with mode 0700) if it does not exist. A brand-new file is
// initialised. A file held by another process fails with ErrInUse; a corrupt,
// truncated, empty or foreign file, or one whose pages do not form a sound
// tree, fails with ErrCorrupt and is left untouched; a
// file from a newer inferd fails with ErrSchema. A file from an older inferd
// is migrated to SchemaVersion, after a copy of it is written beside it
// (Migration says so; the caller logs it).
func Open(path string, opts Options) (*Store, error) {
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.migrations == nil {
		opts.migrations = migrations
	}
	if opts.ReadOnly {
		// bbolt would try to initialise a missing file.
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("open data file: %w", err)
		}
	} else if err := createDataFile(path, opts); err != nil {
		return nil, err
	}
	if err := checkDataFile(path, opts.Timeout); err != nil {
		return nil, err
	}
	if err := checkWALVersion(path); err != nil {
		return nil, err
	}
	db, mig, err := openBolt(path, opts)
	if err != nil {
		return nil, err
	}
	releaseMapped(db, path)
	s := &Store{db: db, path: path, now: opts.Now, migration: mig, applierDone: make(chan struct{}), applyHook: opts.applyHook}
	if err := s.openLog(opts); err != nil {
		closeQuietly(db)
		return nil, err
	}
	s.keys.init()
	s.w.init()
	go s.runWriter()
	return s, nil
}

// openLog folds the write-ahead log a killed daemon left into the data
// file and starts the applier; read-only, it reads the log for reads to see
// and starts none.
func (s *Store) openLog(opts Options) error {
	if opts.ReadOnly {
		var applied uint64
		if err := s.db.View(func(tx *bbolt.Tx) error { applied = walApplied(tx); return nil }); err != nil {
			return err
		}
		s.pend = newPending(applied)
		s.pend.done = true // no applier: a flush returns at once
		close(s.applierDone)
		return loadWAL(s.db, s.path, s.pend)
	}
	next, err := replayWAL(s.db, s.path)
	if err != nil {
		return err
	}
	s.log = openWAL(s.path, nil, next, int64(opts.maxSize))
	s.pend = newPending(next - 1)
	go s.runApplier()
	return nil
}

// createDataFile creates a data file at path if there is none. It builds the
// file under a temporary name and links it into place, so a data file that
// exists was once complete: an empty or truncated one is damage, never a
// first start cut short, and checkDataFile refuses it rather than start
// empty over it.
func createDataFile(path string, opts Options) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("create data directory: %w", err)
	}
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return nil // there is a file (or something unreadable): Open checks it
	}
	tmp := path + ".new"
	if err := os.Remove(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("create data file: remove %s left by an earlier start: %w", tmp, err)
	}
	err := func() error {
		// bbolt writes and fsyncs a complete empty database; openBolt
		// initialises the schema in it (Migration.From 0).
		db, err := bbolt.Open(tmp, 0o600, &bbolt.Options{Timeout: opts.Timeout})
		if err != nil {
			return err
		}
		if err := db.Close(); err != nil {
			return err
		}
		// A link, unlike a rename, never replaces a file another process
		// put in place meanwhile; that file wins.
		if err := os.Link(tmp, path); err != nil && !errors.Is(err, fs.ErrExist) {
			return os.Rename(tmp, path) // a file system without hard links
		}
		return nil
	}()
	_ = os.Remove(tmp)
	if err != nil {
		return fmt.Errorf("create data file %s: %w", path, storageErr(err))
	}
	return syncDir(filepath.Dir(path))
}

// openBolt opens the file with bbolt and checks or initialises the schema.
// bbolt panics on some corrupt files instead of returning an error, and a
// fault in mapped memory is a panic only with SetPanicOnFault: both become
// ErrCorrupt here.
func openBolt(path string, opts Options) (db *bbolt.DB, mig Migration, err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			if db != nil {
				closeQuietly(db)
				db = nil
			}
			err = corruptError(path, fmt.Sprintf("bbolt panicked: %v", r))
		}
	}()
	db, err = bbolt.Open(path, 0o600, &bbolt.Options{
		Timeout:         opts.Timeout,
		MaxSize:         opts.maxSize,
		InitialMmapSize: initialMmapSize,
		FreelistType:    bbolt.FreelistMapType,
		NoFreelistSync:  true, // commits skip writing the freelist; it is rebuilt at open
		ReadOnly:        opts.ReadOnly,
	})
	switch {
	case errors.Is(err, berrors.ErrTimeout):
		return nil, mig, inUseError(path)
	case errors.Is(err, berrors.ErrInvalid), errors.Is(err, berrors.ErrVersionMismatch),
		errors.Is(err, berrors.ErrChecksum), errors.Is(err, berrors.ErrInvalidMapping):
		return nil, mig, corruptError(path, err)
	case err != nil:
		return nil, mig, fmt.Errorf("open data file %s: %w", path, err)
	}
	latest := len(opts.migrations)
	if opts.ReadOnly {
		err = db.View(func(tx *bbolt.Tx) error {
			v, err := fileSchema(tx, path, latest)
			if err == nil && v == 0 {
				err = corruptError(path, "no inferd schema (a file inferd never initialised)")
			}
			mig = Migration{From: v, To: v}
			return err
		})
		if err != nil {
			closeQuietly(db)
			return nil, mig, err
		}
		return db, mig, nil
	}
	if mig.Copy, err = copyBeforeMigration(db, path, latest); err != nil {
		closeQuietly(db)
		return nil, mig, err
	}
	if err := db.Update(func(tx *bbolt.Tx) error {
		var err error
		mig.From, err = migrate(tx, path, opts.migrations)
		return err
	}); err != nil {
		closeQuietly(db)
		var oe *openError
		if errors.As(err, &oe) {
			return nil, mig, err
		}
		return nil, mig, fmt.Errorf("initialise data file %s: %w", path, storageErr(err))
	}
	mig.To = latest
	return db, mig, nil
}

func closeQuietly(db *bbolt.DB) {
	defer func() { _ = recover() }()
	_ = db.Close()
}

// Close drains the call writer (every write queued before Close is committed
// or failed), applies the log to the data file and removes it, then closes
// the file. A log the file could not take (a full disk) stays for the next
// Open. Later calls return ErrClosed.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.w.stop()
		s.pend.close()
		<-s.applierDone
		all := s.pend.stopped()
		if s.log != nil {
			if err := s.log.close(all); err != nil {
				s.closeErr = fmt.Errorf("close data file %s: %w", s.path, err)
			}
		}
		if err := s.db.Close(); err != nil && s.closeErr == nil {
			s.closeErr = fmt.Errorf("close data file %s: %w", s.path, err)
		}
	})
	return s.closeErr
}

// Migration says what Open did to the file's schema: which version it found,
// which it left, and where it copied the file before migrating it.
func (s *Store) Migration() Migration { return s.migration }

// Path returns the data file's path as given to Open.
func (s *Store) Path() string { return s.path }

// Size returns the size of the data file in bytes.
func (s *Store) Size() int64 {
	if fi, err := os.Stat(s.path); err == nil {
		return fi.Size()
	}
	var n int64
	_ = s.db.View(func(tx *bbolt.Tx) error { n = tx.Size(); return nil })
	return n
}

// WriteBackup writes a consistent snapshot of the whole data file to w while
// the store stays in use, and returns the bytes written. The copy opens with
// Open. It holds one read transaction for the whole copy, which delays a
// commit only if that commit must grow the file past the initial map.
func (s *Store) WriteBackup(w io.Writer) (int64, error) {
	s.pend.flush() // every write acknowledged so far is in the copy
	var n int64
	err := s.db.View(func(tx *bbolt.Tx) error {
		var err error
		n, err = tx.WriteTo(w)
		return err
	})
	if err != nil {
		return n, fmt.Errorf("write backup: %w", storageErr(err))
	}
	return n, nil
}

// view and update run fn in a read or a write transaction, classifying
// bbolt's errors (full disk, closed store). Errors fn returns pass unchanged.
func (s *Store) view(fn func(tx *bbolt.Tx) error) error {
	return storageErr(s.db.View(fn))
}

func (s *Store) update(fn func(tx *bbolt.Tx) error) error {
	return storageErr(s.db.Update(fn))
}
