package store

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	berrors "go.etcd.io/bbolt/errors"
)

// Sentinel errors, compared with errors.Is.
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
	// ErrInUse is returned by Open when another process holds the data file.
	ErrInUse = errors.New("data file in use")
	// ErrCorrupt is returned by Open when the data file is corrupt, truncated
	// or not an inferd database.
	ErrCorrupt = errors.New("data file corrupt")
	// ErrSchema is returned by Open when the data file has a schema version
	// this binary does not know (written by a newer inferd).
	ErrSchema = errors.New("unsupported schema version")
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

// openError is an Open failure whose text is meant for the operator as is;
// it matches its sentinel with errors.Is without repeating the sentinel's text.
type openError struct {
	msg   string
	kind  error
	cause error
}

func (e *openError) Error() string        { return e.msg }
func (e *openError) Is(target error) bool { return target == e.kind }
func (e *openError) Unwrap() error        { return e.cause }

func corruptError(path string, detail any) error {
	var cause error
	if err, ok := detail.(error); ok {
		cause = err
	}
	return &openError{
		msg:   fmt.Sprintf("data file %s is corrupt or not an inferd database: %v; restore from a backup", path, detail),
		kind:  ErrCorrupt,
		cause: cause,
	}
}

func inUseError(path string) error {
	return &openError{
		msg:  fmt.Sprintf("data file %s is in use by another inferd process; stop it or use its admin commands", path),
		kind: ErrInUse,
	}
}

// storageErr classifies an error from a bbolt transaction: a full disk
// becomes ErrStorageFull, a closed database ErrClosed.
func storageErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, berrors.ErrMaxSizeReached),
		// bbolt formats a failed file resize with %s, dropping the errno.
		strings.Contains(err.Error(), syscall.ENOSPC.Error()):
		return fmt.Errorf("%w: %w", ErrStorageFull, err)
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return ErrClosed
	}
	return err
}
