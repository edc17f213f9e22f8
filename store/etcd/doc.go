// Package etcd is the store.Store of cluster mode: every record lives in an
// etcd cluster that several inferd nodes share, so a key or project created
// through one node works on every node. It passes the same contract suite
// (store/storetest) as store/bolt, the single-box default.
//
// # Key layout
//
// Every key is under Options.Prefix (default "/inferd/"):
//
//	schema                      the layout version ("2"); Open refuses others
//	teams/<id>                  store.Team (JSON)
//	keys/<id>                   store.APIKey (JSON; only the secret's hash)
//	projects/<id>               store.Project (JSON)
//	modelkeys/<hash>            the id of the project that owns a modelKey hash
//	calls/<id>                  store.Call without its inputs and outputs (JSON)
//	inputs/<id>                 its inputs, the bytes given (none: no key); only a write that carries them puts them
//	inputsize/<id>              their size in bytes (decimal), for reads that leave them out
//	outputs/<id>                its outputs, the bytes given (none: no key); every write puts or deletes them
//	payloads/<id>/<kind>        inputs or outputs over InlineLimit held on nodes instead: PayloadRef
//	                            {size, sha256, nodes} (JSON), only with Options.Payloads
//	meta/<id>                   the call without webhook URL (RecentCalls)
//	pending/<id>                the node that wrote it, while the call is not final (PendingCalls)
//	finished/<unix nanos>/<id>  "" once final, by its Finished (ExpireCalls)
//	idem/<team>/<sha256 of key> the id of the call started with that idempotency key
//	outbox/<delivery id>        a webhook delivery not ended, with the node that queued it (JSON)
//	outboxended/<delivery id>   when it ended (unix nanos): never queued again; ExpireCalls drops it
//	secrets/<team>              the team's webhook signing secret, apart from teams/ (no listing carries it)
//
// # Consistency
//
// Reads are linearizable: a write that returned, through any node, is seen
// by every later read on every node. There is therefore no key or project
// cache here (the Keys and Projects contracts say a cache must be
// invalidated by other writers' changes; this store reads etcd instead).
// Creation is create-if-absent (a compare on the key's CreateRevision);
// UpdateProject, PutProjects, RevokeKey and DeleteProject compare each key's
// ModRevision with the one they read and start again when another writer
// got there first; expiry deletes a call only if it is unchanged since it
// was read, so a call made pending again by another node is never expired.
//
// # Call writes
//
// SaveCallAsync queues; one writer goroutine commits whatever is queued as
// one etcd transaction (a group commit, as store/bolt's writer does), in
// queue order, keeping only the last write of a call that is queued more
// than once in a batch. A transaction is bounded by etcd's limits (128
// operations, 1.5 MiB): a batch holds at most 120 operations (24 to 30
// calls) and about 1 MiB. A commit that fails because etcd is electing a
// leader is retried (the writes are plain puts, so a retry is idempotent)
// for up to Options.RetryFor before the writes fail.
//
// The webhook deliveries a call write makes due (store.DeliveriesFor) are
// queued in its transaction, each by a nested transaction that puts it
// only if its id is neither pending nor ended. The record carries a token
// of the write, so a retried commit that finds its own record knows an
// earlier try was applied, and still tells the OnDeliveryQueued hooks.
// Each node's hooks and PendingDeliveries hold the deliveries its own call
// writes queued: a node's deliverer sends the messages of the calls it
// ran, and recovers them at start-up, as it recovers its pending calls.
//
// Layout version 1 (before payloads had keys of their own) is refused, not
// migrated: cluster mode had no release with it.
//
// # Payloads
//
// Without Options.Payloads, inputs and outputs are kept in etcd, at most
// MaxInlinePayload bytes each; a larger one is refused with
// ErrPayloadTooLarge. With it (cluster mode), those up to InlineLimit
// (64 KiB) are kept in etcd and larger ones are held on nodes (held.go):
// SaveCallAsync has Payloads.Put make them durable on this node and one
// other, in a goroutine of its own, and the call write, which puts their
// PayloadRef instead of the bytes, commits only after that, still in its
// call's order (later writes of the call wait; other calls' writes do
// not). A read finding a ref fetches the payload from its holders,
// checking its size and sha256, within Options.PayloadTimeout, and fails
// with a store.PayloadUnreachableError naming them when none gives it. Expiry
// deletes the refs with the call and then the copies (Payloads.Delete).
package etcd
