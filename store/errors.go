package store

import (
	"errors"
	"fmt"
)

// Sentinel errors, compared with errors.Is. Every implementation returns
// them, wrapped with context, for the same conditions.
var (
	// ErrNotFound is returned when a team, key, project or call does not exist.
	ErrNotFound = errors.New("not found")
	// ErrInvalidKey is returned by Authenticate for a malformed, unknown or
	// revoked API key. It deliberately does not say which.
	ErrInvalidKey = errors.New("invalid api key")
	// ErrStorageFull wraps a commit that failed because the disk is full.
	// Nothing of that commit was written; later writes may succeed once
	// space is freed.
	ErrStorageFull = errors.New("storage full")
	// ErrConflict is returned when a write would break uniqueness, such as a
	// modelKey that already belongs to another project.
	ErrConflict = errors.New("conflict")
	// ErrClosed is returned by every method called after Close.
	ErrClosed = errors.New("store closed")
)

// ValidationError says which field of a record is invalid and why.
type ValidationError struct {
	Field  string // JSON name, e.g. "maxReplicas" or "model.protocol"
	Reason string // e.g. "must be at least 1"
}

// Error returns "field: reason".
func (e *ValidationError) Error() string { return e.Field + ": " + e.Reason }

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}
