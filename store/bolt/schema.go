package bolt

import (
	"encoding/binary"
	"time"
)

// SchemaVersion is the layout of buckets and records this binary reads and
// writes. Bump it, with a step in migrations (migrate.go), whenever a change
// would confuse an older binary; adding a bucket or an omitempty field does not.
const SchemaVersion = 2

// Buckets and their invariants. All keys sort the way they are scanned.
//
//	meta        "schema" → decimal schema version (SchemaVersion once Open has
//	            migrated the file). Present in every initialised file.
//	teams       team id → Team JSON.
//	keys        key id (10 hex chars, the non-secret part of the secret) → APIKey JSON.
//	            Every key's TeamID has an entry in teams.
//	projects    project id → Project JSON. Every project's TeamID has an entry in teams.
//	modelkeys   Model.KeyHash → project id. Exactly one entry per project, and
//	            modelkeys[p.Model.KeyHash] == p.ID; a hash belongs to at most one project.
//	calls       call id ("call_" + UUIDv7, so key order is creation order) → Call JSON,
//	            with its inputs and outputs only when small (store.SmallPayload; since
//	            version 2): a record stays small whatever the payloads.
//	callinputs  call id + 4-byte big-endian chunk number → the next payloadChunk bytes
//	            of the call's large inputs, as the client sent them (payloads.go). Chunks
//	            are numbered from 0 without gaps; a call without inputs has none.
//	            Every call id here has a record in calls.
//	calloutputs the same for the call's outputs, the model's raw JSON reply.
//	callpending call id → empty, exactly for the calls whose state is not final
//	            (queued, booting, running). Scanned at start-up to recover calls.
//	callfinished call id → 8-byte big-endian Finished unix-nanos, exactly for the
//	            calls whose state is final; lets a re-save find the old expiry entry
//	            without decoding the (possibly large) old record.
//	callexpiry  8-byte big-endian Finished unix-nanos + call id → empty, exactly one
//	            per callfinished entry; ExpireCalls scans it from the front.
//	callidem    team id + NUL + idempotency key (store.IdempotencyIndexKey) → call
//	            id, for every stored call started with a key; the last call written
//	            with a key owns it. Deleted with that call by ExpireCalls.
//	callidemof  call id → its callidem key, exactly for the calls started with a
//	            key: lets ExpireCalls find the index entry without decoding the
//	            record. An older binary ignores both buckets: its expiry leaves
//	            entries naming deleted calls, which read as not found.
//	outbox      delivery id → Delivery JSON, exactly for the webhook deliveries not
//	            ended. Written in the same transaction as the call write that queues it.
//	outboxended delivery id → 8-byte big-endian unix-nanos of its call's expiry
//	            horizon (the time it ended): the deliveries ended, kept so that a
//	            re-save of their call never queues them again; ExpireCalls drops them.
//	teamsecrets team id → webhook signing secret ("whsec_..."), kept apart from
//	            teams so that no team listing carries it.
//	usage       8-byte big-endian unix seconds of an hour + team id + NUL + project
//	            id → store.UsageRow JSON: the hour's roll-up (usage.go). A call's
//	            usage is added by the transaction of its first final write.
var (
	bucketMeta         = []byte("meta")
	bucketTeams        = []byte("teams")
	bucketKeys         = []byte("keys")
	bucketProjects     = []byte("projects")
	bucketModelKeys    = []byte("modelkeys")
	bucketCalls        = []byte("calls")
	bucketCallPending  = []byte("callpending")
	bucketCallFinished = []byte("callfinished")
	bucketCallExpiry   = []byte("callexpiry")
	bucketCallInputs   = []byte("callinputs")
	bucketCallOutputs  = []byte("calloutputs")
	bucketCallIdem     = []byte("callidem")
	bucketCallIdemOf   = []byte("callidemof")
	bucketOutbox       = []byte("outbox")
	bucketOutboxEnded  = []byte("outboxended")
	bucketTeamSecrets  = []byte("teamsecrets")
	bucketUsage        = []byte("usage")

	keySchema = []byte("schema")
)

func allBuckets() [][]byte {
	return [][]byte{
		bucketMeta, bucketTeams, bucketKeys, bucketProjects, bucketModelKeys,
		bucketCalls, bucketCallPending, bucketCallFinished, bucketCallExpiry,
		bucketCallInputs, bucketCallOutputs,
		bucketCallIdem, bucketCallIdemOf, bucketOutbox, bucketOutboxEnded, bucketTeamSecrets,
		bucketUsage,
	}
}

type stopIteration struct{}

func (stopIteration) Error() string { return "stop iteration" }

var errStopIteration error = stopIteration{}

// nanosKey encodes t as 8 big-endian bytes of unix nanoseconds, so byte order
// is time order. Times before 1970 encode as 0.
func nanosKey(t time.Time) []byte {
	var b [8]byte
	n := t.UnixNano()
	if n < 0 {
		n = 0
	}
	binary.BigEndian.PutUint64(b[:], uint64(n))
	return b[:]
}
