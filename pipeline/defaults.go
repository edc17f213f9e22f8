package pipeline

import "time"

// The call path's defaults, for the zero values of the API's options and
// the daemon's config (which reads them here, so that config needs nothing
// of httpapi).
const (
	// DefaultStartWait is how long a sync start waits for its result
	// before it answers with the call's id.
	DefaultStartWait = 50 * time.Second
	// DefaultLongPollWait is how long a check with longPoll waits.
	DefaultLongPollWait = 50 * time.Second
	// DefaultMaxBodyBytes caps the body a door reads.
	DefaultMaxBodyBytes = 10 << 20
	// DefaultOpenAIQueueWait is how long an OpenAI request waits for its
	// call to reach a replica (a boot from zero included) before it is
	// answered 503 and its call expires.
	DefaultOpenAIQueueWait = 5 * time.Minute
)
