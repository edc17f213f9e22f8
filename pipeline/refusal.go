package pipeline

import (
	"errors"

	"inferd/scheduler"
	"inferd/store"
)

// Kind is why the pipeline refused a request before a call existed, in a
// word each door maps to its own answer.
type Kind int

// Kinds of refusal.
const (
	// RefusedInternal: a failure of inferd's own (the store); the door
	// logs Err and shows none of it.
	RefusedInternal Kind = iota
	// RefusedKey: the key is unknown, malformed or revoked (never says
	// which).
	RefusedKey
	// RefusedKeyExpired: the key has expired.
	RefusedKeyExpired
	// RefusedScope: the key may not make calls.
	RefusedScope
	// RefusedProject: no such project, or one the key may not reach (the
	// same answer: another team's project is never revealed).
	RefusedProject
	// RefusedBudget: an admission hook refused (Refusal.Hook names it): a
	// key over its rate, its waits or its streams.
	RefusedBudget
	// RefusedQueueFull: the project's queue, or the team's queued quota,
	// is full; retry later.
	RefusedQueueFull
	// RefusedCannotRun: the project needs more than this machine has.
	RefusedCannotRun
	// RefusedIdempotency: the idempotency key was used for another
	// request.
	RefusedIdempotency
	// RefusedUnavailable: no node can take the request (cluster mode), or
	// the store does not answer; retry.
	RefusedUnavailable
	// RefusedStorageFull: the call could not be written.
	RefusedStorageFull
	// RefusedShuttingDown: inferd is stopping; retry.
	RefusedShuttingDown
	// RefusedScheduler: the scheduler refused with a text written for
	// users (it is stopping, a project being deleted, ...); retry.
	RefusedScheduler
)

// Refusal is the pipeline's answer to a request it did not run. Err is the
// cause: a text written for users for every kind but RefusedInternal,
// whose text is for the log only.
type Refusal struct {
	Kind Kind
	Hook string       // the admission hook that refused (RefusedBudget)
	Key  store.APIKey // the key, once known (RefusedScope says what it may do)
	Err  error
}

func (r *Refusal) Error() string { return r.Err.Error() }
func (r *Refusal) Unwrap() error { return r.Err }

// refused classifies err, a failure of a step after resolve (the store's,
// the scheduler's admission), as a Refusal.
func refused(err error) *Refusal {
	var r *Refusal
	if errors.As(err, &r) {
		return r
	}
	k := RefusedInternal
	switch {
	case errors.Is(err, store.ErrUnavailable):
		k = RefusedUnavailable
	case errors.Is(err, store.ErrStorageFull):
		k = RefusedStorageFull
	case errors.Is(err, scheduler.ErrQueueFull), errors.Is(err, scheduler.ErrTeamQuota):
		k = RefusedQueueFull
	case errors.Is(err, scheduler.ErrNeedsGPUs):
		k = RefusedCannotRun
	case errors.Is(err, scheduler.ErrIdempotencyMismatch):
		k = RefusedIdempotency
	case isStoreError(err):
	default:
		k = RefusedScheduler // the scheduler's own texts are written for users
	}
	return &Refusal{Kind: k, Err: err}
}

// isStoreError reports whether err wraps one of the store's sentinels: a
// failure to log, not a text to show.
func isStoreError(err error) bool {
	return errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrInvalidKey) ||
		errors.Is(err, store.ErrConflict) || errors.Is(err, store.ErrClosed)
}
