package store

// StartLookup is what a start reads of the store before its call runs: its
// API key, as Authenticate answers it, and the project of its modelKey, as
// ProjectByModelKey answers it. ProjectErr is meaningful only when KeyErr is
// nil: a store that reads both together leaves the project unread when the
// key is refused.
type StartLookup struct {
	Key        APIKey
	KeyErr     error
	Project    Project
	ProjectErr error
}
