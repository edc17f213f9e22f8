package store

import (
	"context"
	"encoding/json"
	"time"
)

// Store is everything inferd keeps durably. Each implementation (store/bolt,
// the embedded default; store/etcd, cluster mode; store/memstore, in memory
// for tests) satisfies it
// and passes the contract suite in store/storetest, which is the executable
// form of the rules written here. Callers depend on the smaller interfaces
// below, or declare their own subset where they consume it.
//
// Methods are safe for concurrent use. After Close every method fails with
// ErrClosed. Records handed out are the caller's: changing one never changes
// what the store holds.
type Store interface {
	Teams
	Keys
	Projects
	Calls
	Outbox
	Usage
	// Close finishes every call write queued before it (committed or
	// failed, its done run) and releases the store.
	Close() error
}

// Teams are created implicitly by the first key or project that names them.
type Teams interface {
	// EnsureTeam creates the team if it does not exist and reports whether
	// it did. An invalid id is a *ValidationError.
	EnsureTeam(id string) (created bool, err error)
	// ListTeams returns every team, sorted by id.
	ListTeams() ([]Team, error)
	// GetTeam returns the team with the given id, or ErrNotFound.
	GetTeam(id string) (Team, error)
	// SetTeamQuota replaces the team's quota, creating the team if it does
	// not exist, and returns the team. An invalid id or quota is a
	// *ValidationError.
	SetTeamQuota(id string, q Quota) (Team, error)
	// OnTeamChange registers fn to be called with a team's id after each
	// committed SetTeamQuota that changed something; like OnProjectChange,
	// hooks run after the commit on the writer's goroutine, in order.
	OnTeamChange(fn func(teamID string))
}

// Keys are API keys. Only a key's hash is stored (see NewKey).
//
// Revocation is immediate: once RevokeKey returns, Authenticate refuses the
// key, in this process. store/bolt meets this with a cache of recent keys
// that it empties on every revocation; that is sound only because bbolt's
// file lock makes this process the file's one writer. An implementation
// that other processes write too must invalidate such a cache on their
// writes (a watch) or not cache at all, as store/etcd (cluster mode) does:
// it reads etcd on every call.
type Keys interface {
	// CreateKey creates an API key for the team, creating the team if it
	// does not exist, and returns the secret, which is shown once and never
	// stored. An empty scope means ScopeTeam; a bad team id or scope is a
	// *ValidationError.
	CreateKey(teamID string, scope KeyScope) (secret string, k APIKey, err error)
	// CreateScopedKey is CreateKey for a key narrowed by lim (permissions,
	// expiry, project allowlist); an invalid lim is a *ValidationError.
	// CreateKey is CreateScopedKey with zero limits.
	CreateScopedKey(teamID string, scope KeyScope, lim KeyLimits) (secret string, k APIKey, err error)
	// ListKeys returns the keys of a team, or of every team when teamID is
	// "", sorted by team, then creation time. Revoked keys are included.
	ListKeys(teamID string) ([]APIKey, error)
	// RevokeKey revokes the key with the given id (ErrNotFound if there is
	// none). Revoking a revoked key keeps its first revocation time.
	RevokeKey(id string) error
	// Authenticate returns the key a secret belongs to. A malformed,
	// unknown or revoked secret, or a wrong secret for a known id, fails
	// with ErrInvalidKey. It is on every request's path: implementations
	// keep it cheap and compare hashes in constant time.
	Authenticate(secret string) (APIKey, error)
}

// Projects are deployments with their model spec.
//
// Writes are seen at once: once a write returns, GetProject,
// ProjectByModelKey and ListProjects return what it wrote, in this process.
// store/bolt caches ProjectByModelKey (it is on every /start path) and
// empties the cache on each project write; like the key cache this is sound
// only while this process is the one writer (see Keys).
type Projects interface {
	// PutProject creates or replaces the project with p.ID (creating its
	// team if missing) and reports which. Content equal to the stored
	// project (SameContent) writes nothing and returns ChangeUnchanged.
	// Created is kept from the stored project; both stamps of p are
	// ignored. An invalid project returns its *ValidationError as is; a
	// modelKey hash that belongs to another project fails with ErrConflict.
	PutProject(p Project) (Change, error)
	// PutProjects is PutProject for several projects at once: all are
	// written or, on any error, none is (an apply never leaves a manifest
	// half applied). Changes come back in the order of ps. A project that
	// is a manifest's declaration (Project.Declared) is merged with the
	// stored one first (Reapply), in the same transaction, and a new
	// declaration alone is recorded but reported unchanged (PutChange).
	PutProjects(ps []Project) ([]Change, error)
	// UpdateProject loads the project, lets fn change it, validates and
	// saves it atomically: concurrent updates never lose each other's
	// changes. An error from fn aborts and is returned as is (as is a
	// *ValidationError), leaving the project unchanged. fn must be quick
	// and must not call the store; it may run more than once, and may not
	// change the id. A missing project fails with ErrNotFound.
	UpdateProject(id string, fn func(*Project) error) (Project, error)
	// GetProject returns the project with the given id, or ErrNotFound.
	GetProject(id string) (Project, error)
	// ProjectByModelKey returns the project whose modelKey this is (looked
	// up by HashModelKey), or ErrNotFound. The modelKey itself is never
	// stored or put in errors.
	ProjectByModelKey(modelKey string) (Project, error)
	// ListProjects returns the projects of a team, or of every team when
	// teamID is "", sorted by id.
	ListProjects(teamID string) ([]Project, error)
	// DeleteProject deletes the project and frees its modelKey, or fails
	// with ErrNotFound. Its calls stay until they expire.
	DeleteProject(id string) error
	// OnProjectChange registers fn to be called with a project's id after
	// each committed create, update or delete of that project (not for a
	// write that changed nothing). Hooks run in registration order on the
	// goroutine that made the change, after the commit; they should return
	// quickly (e.g. signal the scheduler's loop).
	OnProjectChange(fn func(projectID string))
}

// Calls are inference calls. Writes of calls are durable when they report
// success, and apply in the order they were queued.
//
// A call's payloads are kept apart from the rest of it, so that neither is
// read where it is not needed: a write that carries no Inputs keeps the
// stored inputs (the scheduler drops a queued call's inputs from memory
// once they are durable and reads them back with CallInputs when it
// dispatches the call), while Outputs are replaced by every write. Inputs
// and Outputs must be valid JSON (the API and the model client check them):
// they are stored and handed back as the same bytes (whitespace around the
// value aside), never encoded again. Small ones (SmallPayload) may be kept
// with the rest of the call.
//
// The first write of a call in a final state that carries Usage adds it
// to the usage roll-up of the hour it finished in (CallUsageRow), in the
// same commit; later final writes of the call add nothing (see Usage).
type Calls interface {
	// SaveCall durably creates or replaces the call: it returns once the
	// write is committed, or with the commit's error (ErrStorageFull for a
	// full disk, ErrClosed after Close). ctx bounds only the wait: a write
	// already queued still happens when ctx ends. A call in a final state
	// without Finished gets the current time.
	SaveCall(ctx context.Context, c Call) error
	// SaveCallAsync queues the write and returns at once; done receives the
	// commit's result (nil once durable). Writes apply in the order they
	// were queued, so a later write of the same call wins. done runs after
	// the commit on a goroutine of the store's, so it must not block; when
	// the write is refused up front (an id ValidateCallID rejects, a closed
	// store) it runs before SaveCallAsync returns. done may be nil. The
	// store may keep c's Inputs and Outputs until done runs: the caller
	// does not change their bytes.
	SaveCallAsync(c Call, done func(error))
	// GetCall returns the committed state of a call, with its inputs and
	// outputs, or ErrNotFound.
	GetCall(id string) (Call, error)
	// GetCallResult returns the call without its inputs (InputBytes says
	// their size) and with its outputs as the raw bytes stored, copied once
	// and never decoded: what answering a check needs. ErrNotFound as GetCall.
	GetCallResult(id string) (Call, error)
	// CallInputs returns the stored inputs of a call (nil when it has none),
	// or ErrNotFound: read when a queued call is dispatched.
	CallInputs(id string) (json.RawMessage, error)
	// PendingCalls returns every call not in a final state, oldest first
	// (by id: call ids are UUIDv7), without inputs or outputs (InputBytes
	// says the inputs' size). The scheduler recovers them at start-up.
	PendingCalls() ([]Call, error)
	// RecentCalls returns up to limit calls of teamID ("" = every team),
	// newest first, without their inputs and outputs: what a status page
	// may show. An implementation may bound how many records it examines.
	RecentCalls(teamID string, limit int) ([]Call, error)
	// CallByIdempotencyKey returns the call that team teamID started with
	// idempotency key key, as GetCallResult does (without its inputs), or
	// ErrNotFound. Every stored call with a key is
	// found by it until the call expires; a later write of another call
	// with the same team and key takes the key over.
	CallByIdempotencyKey(teamID, key string) (Call, error)
	// ExpireCalls deletes the finished calls whose Finished is before
	// finishedBefore and returns how many it deleted. Calls not finished
	// are never expired.
	ExpireCalls(finishedBefore time.Time) (int, error)
}
