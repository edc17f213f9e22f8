// Package bolt is the embedded store.Store: inferd's durable state in one
// bbolt file, <dataDir>/inferd.db: teams, API keys, projects and every
// inference call, with a write-ahead log of call writes beside it
// (inferd.db.wal.N) while the store is open or after a daemon was killed.
// It is the only package that imports bbolt.
//
// # Durability rules
//
//   - A callID returned to a client is committed: callers save the call with
//     SaveCall (which returns only after the fsync) before they answer, and
//     save its result before they wake any waiter.
//   - Call records go through one group-commit writer goroutine owned by the
//     Store. It takes everything queued and appends it, in queue order, to
//     the write-ahead log with one fdatasync (wal.go, writer.go): that is the
//     commit, shared by concurrent requests. The log's segments are made
//     ahead, zero-filled (walprep.go), so an append never changes a file's
//     size and its fdatasync writes no inode. It commits as soon as the
//     previous commit ends, so a lone writer never waits for a timer (bbolt's
//     Batch does, and may run its function twice). Writes of the same call
//     apply in the order they were queued: the last one wins.
//   - An applier goroutine copies logged writes into bbolt in the background,
//     many to a transaction, and records there the last one it applied
//     (unapplied.go). Until then a logged write is its call's truth: point
//     reads look at it first, scans wait for the applier. Open replays the
//     writes the file lacks (a killed daemon's), exactly once; Close applies
//     everything and removes the log. While bbolt cannot take the writes (a
//     full disk) new writes are refused with its error.
//   - Rare admin writes (teams, keys, projects) use their own short write
//     transaction; reads use short read transactions. No transaction is held
//     while calling back into user code, except the fn of UpdateProject.
//   - NoSync is never set. NoFreelistSync is: the freelist is rebuilt when the
//     file is opened, which makes each commit cheaper. The rebuild reads every
//     page; Open then releases the pages from the process's map (they stay in
//     the page cache), so idle RSS does not grow with the number of stored calls.
//   - A data file that is corrupt, truncated, empty, not a bbolt file or
//     written by a newer inferd is refused with a clear error and never
//     recreated or overwritten. Before bbolt maps a file, every page of its
//     tree is read and checked (checkTree), because bbolt trusts its pages
//     and a damaged one would otherwise panic where no recover reaches. A
//     missing file is created whole under a temporary name and linked into
//     place, so an empty data file is always damage.
//   - Finished calls are indexed by finish time and deleted after the result
//     TTL by ExpireCalls/RunSweeper in short transactions, so the file stays
//     bounded (bbolt reuses freed pages; the file itself never shrinks).
//   - A call's large inputs and outputs live in buckets of their own, in
//     chunks (payloads.go), not in its record: a check decodes only the
//     record and copies the outputs' bytes once; a queued call's inputs are
//     read when it is dispatched. Small ones (store.SmallPayload) are in the
//     record, spliced in as they are. Pages read for a payload are dropped from the process's
//     map after the copy, so RSS does not grow with the payloads read.
//
// The bucket layout and its invariants are documented in schema.go.
package bolt
