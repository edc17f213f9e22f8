package bolt

import (
	"errors"
	"fmt"
	"strings"
	"syscall"

	berrors "go.etcd.io/bbolt/errors"

	"inferd/store"
)

// Errors of Open, compared with errors.Is. The store's other errors are the
// sentinels of package store.
var (
	// ErrInUse is returned by Open when another process holds the data file.
	ErrInUse = errors.New("data file in use")
	// ErrCorrupt is returned by Open when the data file is corrupt, truncated
	// or not an inferd database.
	ErrCorrupt = errors.New("data file corrupt")
	// ErrSchema is returned by Open when the data file has a schema version
	// this binary does not know (written by a newer inferd).
	ErrSchema = errors.New("unsupported schema version")
)

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
		return fmt.Errorf("%w: %w", store.ErrStorageFull, err)
	case errors.Is(err, berrors.ErrDatabaseNotOpen):
		return store.ErrClosed
	}
	return err
}
