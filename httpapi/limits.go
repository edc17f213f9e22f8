package httpapi

import (
	"fmt"
	"net/http"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Limits bound what one API key, and all keys together, may hold of the
// server. A zero field means no limit; the daemon's config supplies the
// defaults (see config.Limits).
type Limits struct {
	// RequestsPerSecond is the sustained request rate of one API key on
	// every key-authenticated endpoint; Burst is how many it may send at
	// once. Over it, the project API answers 429 and Start/Check an
	// "error: rate limit exceeded" message (no call is created).
	RequestsPerSecond float64
	Burst             int
	// MaxWaitsPerKey and MaxWaits cap the requests held open waiting for a
	// result (Start without startOnly, Check with longPoll), per key and in
	// total. Over a cap the request is answered at once with the call's
	// current state, as if it had not asked to wait: an "error:" here would
	// tell the client that a call which is still running has failed.
	MaxWaitsPerKey int
	MaxWaits       int
	// MaxInputDepth is the deepest nesting of arrays and objects accepted in
	// modelInputs (the object itself is depth 1).
	MaxInputDepth int

	// The budgets of the edge, which no caller passes with a key or
	// without (docs/security.md, "Budgets"; budgets.go).
	//
	// BodyBytes and BodyBytesPerSource cap the bytes of request bodies
	// being read at once, in all and per client address (an IPv6 client's
	// /64): the buffers that hold them, as they grow. Before auth, which
	// for start and check needs the body, the address is all a caller is.
	// Per connection the cap is MaxBodyBytes: a connection reads one
	// request at a time.
	BodyBytes, BodyBytesPerSource int64
	// BodyReadTimeout is the time a client has to send a request's body,
	// counted from the end of its headers.
	BodyReadTimeout time.Duration
	// MaxStreamsPerKey caps the event streams (GET /v1/calls/:id/events)
	// one key holds open.
	MaxStreamsPerKey int
	// StreamResultBytes caps the bytes of finished calls' results that
	// event streams hold in memory, each result counted once however many
	// streams share it.
	StreamResultBytes int64
	// StreamWriteTimeout is how long one event may take to reach a client:
	// a reader slower than that is cut off, not buffered for.
	StreamWriteTimeout time.Duration
}

// errRateLimited is the answer to a key over its request rate.
func errRateLimited(perSecond float64) error {
	return &userError{http.StatusTooManyRequests, codeRateLimited, fmt.Sprintf(
		"rate limit exceeded (%g requests per second per API key); retry later", perSecond)}
}

func errInputsTooDeep(max int) error {
	return badRequest("modelInputs nest deeper than %d levels", max)
}

// pruneAt is the number of tracked keys above which idle entries are dropped.
// Only authenticated keys get an entry, so the map is bounded by the number
// of keys an administrator created; pruning only keeps revoked and unused
// keys from lingering.
const pruneAt = 4096

// limiter enforces Limits per API key id. It is safe for concurrent use.
type limiter struct {
	limits Limits
	// nodes, in cluster mode, is how many live nodes share each key's
	// rate (Options.RateNodes): each node allows its part, so the cluster
	// together allows the key's rate. Nil: a single box.
	nodes func() int

	mu    sync.Mutex
	keys  map[string]*keyUsage
	waits int // requests waiting across all keys
}

// keyUsage is what one key currently holds.
type keyUsage struct {
	rate    *rate.Limiter // nil when the rate is unlimited
	split   int           // the nodes rate is this node's part of (1 on a box)
	waits   int
	streams int // open event streams, also counted in waits
}

func newLimiter(l Limits, nodes func() int) *limiter {
	return &limiter{limits: l, nodes: nodes, keys: make(map[string]*keyUsage)}
}

// split is how many nodes share each key's rate now: 1 on a single box.
func (l *limiter) split() int {
	if l.nodes == nil {
		return 1
	}
	return max(l.nodes(), 1)
}

// part sets u's rate to this node's part of the key's rate when split
// nodes share it: the rate divided among them, and the burst too (at least
// one request each, so a cluster of more nodes than the burst allows a
// burst of one per node); l.mu is held.
func (l *limiter) part(u *keyUsage, split int) {
	if u.split == split {
		return
	}
	u.split = split
	u.rate.SetLimit(rate.Limit(l.limits.RequestsPerSecond / float64(split)))
	u.rate.SetBurst(max(l.limits.Burst/split, 1))
}

// usage returns the entry of key id; l.mu is held.
func (l *limiter) usage(id string) *keyUsage {
	u, ok := l.keys[id]
	if ok {
		return u
	}
	if len(l.keys) >= pruneAt {
		l.prune()
	}
	u = &keyUsage{}
	if l.limits.RequestsPerSecond > 0 {
		split := l.split()
		u.rate = rate.NewLimiter(rate.Limit(l.limits.RequestsPerSecond/float64(split)), max(l.limits.Burst/split, 1))
		u.split = split
	}
	l.keys[id] = u
	return u
}

// prune drops keys that wait for nothing and have their full burst back,
// which is exactly what a fresh entry would hold; l.mu is held.
func (l *limiter) prune() {
	for id, u := range l.keys {
		if u.waits == 0 && u.streams == 0 && (u.rate == nil || u.rate.Tokens() >= float64(u.rate.Burst())) {
			delete(l.keys, id)
		}
	}
}

// allow takes one request from key id's rate, or returns the error to answer.
func (l *limiter) allow(id string) error {
	if l.limits.RequestsPerSecond <= 0 {
		return nil
	}
	split := l.split() // outside mu: the cluster's node count has a lock of its own
	l.mu.Lock()
	u := l.usage(id)
	l.part(u, split)
	l.mu.Unlock()
	if !u.rate.Allow() { // rate.Limiter has its own lock
		return errRateLimited(l.limits.RequestsPerSecond)
	}
	return nil
}

// beginWait reserves a waiting slot for key id. It returns the function that
// gives the slot back, or ok=false when the key or the server is at its cap.
func (l *limiter) beginWait(id string) (release func(), ok bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.usage(id)
	if l.atWaitCap(u) {
		return nil, false
	}
	u.waits++
	l.waits++
	return func() {
		l.mu.Lock()
		u.waits--
		l.waits--
		l.mu.Unlock()
	}, true
}

// atWaitCap reports whether a key with usage u, or the server, holds all
// the requests it may hold open. Callers hold mu.
func (l *limiter) atWaitCap(u *keyUsage) bool {
	return (l.limits.MaxWaitsPerKey > 0 && u.waits >= l.limits.MaxWaitsPerKey) ||
		(l.limits.MaxWaits > 0 && l.waits >= l.limits.MaxWaits)
}

// beginStream reserves a slot for an event stream of key id: one of its
// MaxStreamsPerKey, and a wait (a stream waits on its call as a long poll
// does). It returns the function that gives both back, or the refusal.
func (l *limiter) beginStream(id string) (release func(), err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	u := l.usage(id)
	switch {
	case l.limits.MaxStreamsPerKey > 0 && u.streams >= l.limits.MaxStreamsPerKey:
		return nil, errStreamsPerKey(l.limits.MaxStreamsPerKey)
	case l.atWaitCap(u):
		return nil, errTooManyWaits
	}
	u.streams++
	u.waits++
	l.waits++
	return func() {
		l.mu.Lock()
		u.streams--
		u.waits--
		l.waits--
		l.mu.Unlock()
	}, nil
}

// errTooManyWaits refuses an event stream to a key (or a server) at its cap
// of held-open requests.
var errTooManyWaits = &userError{http.StatusTooManyRequests, codeRateLimited,
	"too many requests of this API key are waiting; close some and retry"}

// jsonDepthExceeds reports whether the JSON value v nests arrays and objects
// more than max levels deep. v must be valid JSON (the decoder has checked
// it); only brackets outside strings count.
func jsonDepthExceeds(v []byte, max int) bool {
	depth := 0
	inString, escaped := false, false
	for _, c := range v {
		switch {
		case escaped:
			escaped = false
		case inString:
			switch c {
			case '\\':
				escaped = true
			case '"':
				inString = false
			}
		case c == '"':
			inString = true
		case c == '{' || c == '[':
			depth++
			if depth > max {
				return true
			}
		case c == '}' || c == ']':
			depth--
		}
	}
	return false
}
