// Package store holds inferd's domain records (Team, APIKey, Project with
// its ModelSpec, Call), their validation and defaults, the sentinel errors,
// and the Store interfaces that the rest of inferd reads and writes through.
//
// It knows nothing of how records are kept. The implementations are
// store/bolt (one embedded bbolt file, the default), store/etcd (cluster
// mode: records in etcd, shared by several nodes) and store/memstore (in
// memory, for tests); store/storetest is the contract suite all three pass.
//
// # Durability rules every implementation keeps
//
//   - A call write that reports success is durable: callers save a call
//     before they answer with its id, and save its result before they wake
//     any waiter.
//   - Call writes apply in the order they were queued; the last write of a
//     call wins.
//   - A write that returns is seen at once by every read in this process
//     (see Keys and Projects for the caches this constrains).
package store
