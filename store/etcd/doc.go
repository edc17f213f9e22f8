// Package etcd is the store.Store of cluster mode: every record lives in an
// etcd cluster that several inferd nodes share, so a key or project created
// through one node works on every node. It passes the same contract suite
// (store/storetest) as store/bolt, the single-box default.
//
// # Key layout
//
// Every key is under Options.Prefix (default "/inferd/"):
//
//	schema                      the layout version ("3"); Open upgrades "2" (upgrade.go) and refuses others
//	teams/<id>                  store.Team (JSON), plus the token of the write that created it
//	keys/<id>                   store.APIKey (JSON; only the secret's hash)
//	projects/<id>               store.Project (JSON), plus the token of the write that put it
//	modelkeys/<hash>            the id of the project that owns a modelKey hash
//	calls/<id>                  store.Call (JSON); without its inputs and outputs, but for a final
//	                            write's small ones (up to store.SmallPayload, valid JSON): the bytes given,
//	                            as "inputs" and "outputs" at the record's end (layout 3)
//	inputs/<id>                 its inputs, the bytes given (none: no key); only a write that carries them
//	                            and does not keep them in the record puts them
//	inputsize/<id>              their size in bytes (decimal), for reads that leave them out
//	outputs/<id>                its outputs, the bytes given (none, or in the record: no key); every write
//	                            puts or deletes them
//	payloads/<id>/<kind>        inputs or outputs over InlineLimit held on nodes instead: PayloadRef
//	                            {size, sha256, nodes} (JSON), only with Options.Payloads
//	meta/<id>                   written by earlier builds only: the call without webhook URL;
//	                            RecentCalls now reads calls/, and ExpireCalls deletes these with their call
//	pending/<id>                the node that holds it (wrote it, or the leader handed it to), while not final (PendingCalls)
//	finished/<unix nanos>/<id>  "" once final, by its Finished (ExpireCalls); a put here is
//	                            a call made final through some node (OnCallFinal's watch)
//	idem/<team>/<sha256 of key> the id of the call started with that idempotency key
//	outbox/<delivery id>        a webhook delivery not ended, with the node that queued it (JSON)
//	outboxended/<delivery id>   when it ended (unix nanos): never queued again; ExpireCalls drops it
//	secrets/<team>              the team's webhook signing secret, apart from teams/ (no listing carries it)
//	assign/<node>/<id>          "": the leader handed call <id> to <node> (HandOver); that node adopts it and deletes the key
//	usage/c/<hour>/<id>         an addition to an hour's usage: a final call's (put by its first final write) or an AddUsage row
//	usage/h/<hour>/<team>/<project>  the hour's usage roll-up, its additions folded in (usage.go)
//
// Package cluster keeps nodes/, election/ and placement/ under the same
// prefix (cluster/doc.go).
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
// # Errors
//
// Every etcd request is bounded by Options.RequestTimeout (a call write by
// RetryFor, then one more request timeout); a request that etcd does not
// answer in time, or answers with no leader, fails with an error wrapping
// store.ErrUnavailable (quorum lost, or this node cut off), which the API
// answers as "cluster unavailable; retry".
//
// # Call writes
//
// SaveCallAsync queues; one writer goroutine commits whatever is queued as
// one etcd transaction (a group commit, as store/bolt's writer does), in
// queue order, keeping only the last write of a call that is queued more
// than once in a batch. A transaction is bounded by etcd's limits (128
// operations, 1.5 MiB): a batch holds at most 120 operations (8 to 40
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
// # Fencing on the node's lease
//
// In cluster mode a node's call writes are fenced on its lease (package
// cluster keeps nodes/<name> under it). BindLease names the node's key and
// its current lease; each call is bound at its first write (or when the
// leader hands it to this node: Adopt) to the lease current then, and
// keeps that binding until its final write. Every write of a bound call
// is, inside the group commit, a nested transaction that compares the
// key's lease with the call's (its inputs and webhook deliveries inside
// it): when the node's lease lapsed, its key is gone or under a new lease,
// the compare fails, that write ends with an error wrapping
// store.ErrFenced, and the rest of the batch commits. So a node that was
// cut off and came back cannot write the result of a call the leader
// handed on meanwhile; a rejoin's new lease never applies to calls taken
// under the old one.
//
// A lease alone does not fence a node that shut down cleanly (revoking
// its lease, so the leader hands its calls on at once) and started again
// quickly: its recovery (PendingCalls) may read a call before the leader
// moves it, and the new process holds a valid lease. So each write of a
// bound call compares also that the call is still this node's: a call
// this process was handed (PendingCalls, Adopt) or has written compares
// that pending/<id> names this node (the compare runs before a final
// write deletes it), and a call first written here with neither, a
// creation (a sync start's one final write too), that calls/<id> is
// absent. Which of the two is read at commit, so a creation's next write
// queued before it committed compares the pending entry it put. A
// creation sends no deletes: while the call is absent so is every key a
// call write deletes (its pending entry, outputs, payload refs). A write
// of a call handed on, or made final by another node or the leader, or a
// creation of an id that exists, ends with store.ErrFenced (its error
// names which compare failed: the lease, the call's node, final, exists),
// and the other node's record stands; a resave of a final write that had
// landed after all is refused the same way, leaving that result. A commit
// retried after etcd elected a leader that finds a fenced call's record as
// it writes it counts that write as committed (its earlier try was
// applied), and tells the deliveries found with its records. Leader writes
// (assign.go) and ImportCall (create-if-absent) are not call writes of
// this writer and compare what they did before. With no lease bound (a
// single node, tests, the CLI) writes compare nothing. The nested
// transactions count against etcd's 128 operations per transaction (see
// writer.go's opCount). A call's
// binding, and the mark that it is this node's, live in memory from its
// first write (or PendingCalls, Adopt) until its final write; those of
// calls the scheduler abandoned when the lease lapsed stay until the
// process ends (a few dozen bytes each).
//
// # Leader writes
//
// The cluster leader moves the calls of a lost node (assign.go): HandOver
// rewrites a call queued, names its new node in pending/<id> and puts
// assign/<node>/<id>; FailLost makes it final as any final write does;
// HandOverDeliveries gives the lost node's outbox records to a live node,
// whose store hears of them through a watch of outbox/ and tells its
// deliverer. Each is one transaction comparing the leader's election key
// (Fence) and the record's revision as read: a deposed leader, or one
// working from a stale read, changes nothing (ErrNotLeader,
// ErrCallChanged).
//
// # Layouts
//
// Layout 3 differs from layout 2 in one thing: a final write keeps its
// small inputs and outputs in the call's record, so a sync start, a
// creation that is final at once, puts calls/<id>, finished/ and its usage
// entry: three writes under a lease, where layout 2 put six (inputs/,
// inputsize/ and outputs/ besides). Only final writes do: a call's writes
// before its last keep the inputs in keys of their own, since a later
// write that carries none (the scheduler drops large inputs once durable;
// a recovered or adopted call's writes carry none) rewrites the record and
// must not lose them, and a final call is written again only by a resave
// of its final write (under a lease any other write of it is fenced).
// Every read takes the record's payloads first and the keys for a record
// without them, so layout 2's calls read as they were written: the
// upgrade (upgrade.go) writes only the version, once no node of an
// earlier release is live. A layout 2 node would misread a layout 3
// call's outputs (it finds no outputs/ key); it refuses a layout 3 prefix
// at start, and a node of this release does not upgrade while one runs.
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
