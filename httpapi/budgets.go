package httpapi

import (
	"fmt"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"
)

// The budgets of the edge bound what any caller, with a key or without, can
// make the server hold: the bytes of request bodies being read (global and
// per client address), the time to send a body, the connections (conns.go),
// the event streams of a key, the results held for streams and the time an
// event may take to reach its reader (events.go). Each is enforced before
// the work it guards, counted in inferd_budget_refusals_total under the
// name of its config key, and refused with a message that names that key:
// HTTP 200 with "error: ..." on the inference endpoints (the Banana
// contract), 429 when the caller is over its own share, 503 when a shared
// budget is full, each with Retry-After, elsewhere. docs/security.md,
// "Budgets", lists them with their defaults.
const (
	budgetBodyBytes          = "limits.bodyBytes"
	budgetBodyBytesPerSource = "limits.bodyBytesPerSource"
	budgetBodyReadTimeout    = "limits.bodyReadTimeout"
	budgetConnections        = "limits.maxConnections"
	budgetStreamsPerKey      = "limits.maxStreamsPerKey"
	budgetStreamResultBytes  = "limits.streamResultBytes"
	budgetStreamWriteTimeout = "limits.streamWriteTimeout"
)

// budgetNames are every budget's name, for the refusal counter's series.
var budgetNames = []string{budgetBodyBytes, budgetBodyBytesPerSource, budgetBodyReadTimeout,
	budgetConnections, budgetStreamsPerKey, budgetStreamResultBytes, budgetStreamWriteTimeout}

// retryAfterSeconds is the Retry-After of a refusal for a budget that is
// full now and frees as the requests holding it end.
const retryAfterSeconds = "1"

// budgetError is a refusal by a budget: a userError that names the budget,
// so that the refusal counter and the Retry-After header need no second
// look at the text.
type budgetError struct {
	userError
	budget string
}

func (e *budgetError) Unwrap() error { return &e.userError }

func overBudget(status int, budget, format string, args ...any) *budgetError {
	code := codeUnavailable
	if status == http.StatusTooManyRequests {
		code = codeRateLimited
	}
	return &budgetError{userError{status, code, fmt.Sprintf(format, args...) + " (" + budget + "); retry later"}, budget}
}

func errBodyBytes(max int64) error {
	return overBudget(http.StatusServiceUnavailable, budgetBodyBytes,
		"server busy: request bodies being read hold the %s they may", sizeText(max))
}

func errBodyBytesPerSource(max int64) error {
	return overBudget(http.StatusTooManyRequests, budgetBodyBytesPerSource,
		"too many request body bytes from this address at once: at most %s", sizeText(max))
}

func errBodyReadTimeout(d time.Duration) error {
	return &budgetError{userError{http.StatusRequestTimeout, "request_timeout",
		fmt.Sprintf("request body not received within %gs (%s); send it faster or in smaller pieces", d.Seconds(), budgetBodyReadTimeout)},
		budgetBodyReadTimeout}
}

func errStreamsPerKey(max int) error {
	return overBudget(http.StatusTooManyRequests, budgetStreamsPerKey,
		"this API key has %d event streams open, as many as it may; close some", max)
}

func errStreamResultBytes(max int64) error {
	return overBudget(http.StatusServiceUnavailable, budgetStreamResultBytes,
		"server busy: event streams hold the %s of results they may; POST /check/v4 answers the result now", sizeText(max))
}

// errResultBytes refuses a result to a reader of GET /v1/calls/ID/response
// while the results being sent hold their budget.
func errResultBytes(max int64) error {
	return overBudget(http.StatusServiceUnavailable, budgetStreamResultBytes,
		"server busy: results being sent hold the %s they may", sizeText(max))
}

// sizeText writes a byte count in MiB when it is a whole number of them.
func sizeText(n int64) string {
	if n >= 1<<20 && n%(1<<20) == 0 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d bytes", n)
}

// setRetryAfter adds Retry-After to the answer of a refusal by a budget
// that frees by itself; a request that can never pass (a body too slow)
// gets none.
func setRetryAfter(w http.ResponseWriter, err error) {
	if be, ok := err.(*budgetError); ok && be.status != http.StatusRequestTimeout {
		w.Header().Set("Retry-After", retryAfterSeconds)
	}
}

// bodyBudget bounds the bytes of request bodies being read at once, in all
// and per source (sourceOf). It counts what the buffers holding bodies take
// (readBody reserves before it allocates), so the bound is on memory, not on
// what clients announce. A zero cap is no cap. It is safe for concurrent
// use.
type bodyBudget struct {
	total, perSource int64

	mu       sync.Mutex
	used     int64
	bySource map[string]int64 // only sources that hold bytes now
	peak     atomic.Int64     // the most used at once, for tests and benchmarks
}

func newBodyBudget(total, perSource int64) *bodyBudget {
	return &bodyBudget{total: total, perSource: perSource, bySource: map[string]int64{}}
}

// check says whether n more bytes from source would fit now, without taking
// them: the answer to a Content-Length that cannot fit is a refusal before
// any of the body is read.
func (b *bodyBudget) check(source string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.fits(source, n)
}

// fits is check with b.mu held.
func (b *bodyBudget) fits(source string, n int64) error {
	if b.perSource > 0 && source != "" && b.bySource[source]+n > b.perSource {
		return errBodyBytesPerSource(b.perSource)
	}
	if b.total > 0 && b.used+n > b.total {
		return errBodyBytes(b.total)
	}
	return nil
}

// reserve takes n bytes for source, or refuses them.
func (b *bodyBudget) reserve(source string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fits(source, n); err != nil {
		return err
	}
	b.used += n
	if source != "" {
		b.bySource[source] += n
	}
	if b.used > b.peak.Load() {
		b.peak.Store(b.used)
	}
	return nil
}

// release gives back n bytes of source.
func (b *bodyBudget) release(source string, n int64) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if source == "" {
		return
	}
	if left := b.bySource[source] - n; left > 0 {
		b.bySource[source] = left
	} else {
		delete(b.bySource, source)
	}
}

// inUse returns the bytes held now.
func (b *bodyBudget) inUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// bodyAccount is what one request's body holds of a bodyBudget. A nil
// account holds nothing and refuses nothing (the admin socket's bodies).
type bodyAccount struct {
	budget *bodyBudget
	source string // "": counted in all only
	held   int64
}

// account opens the account of a request from remoteAddr, counted against
// its source's budget too when perSource.
func (b *bodyBudget) account(remoteAddr string, perSource bool) *bodyAccount {
	if b == nil || b.total <= 0 && b.perSource <= 0 {
		return nil
	}
	acct := &bodyAccount{budget: b}
	if perSource {
		acct.source = sourceOf(remoteAddr)
	}
	return acct
}

// check refuses a body whose announced length could not fit now.
func (a *bodyAccount) check(n int64) error {
	if a == nil || n <= 0 {
		return nil
	}
	return a.budget.check(a.source, n)
}

// grow takes n more bytes, or refuses them.
func (a *bodyAccount) grow(n int64) error {
	if a == nil {
		return nil
	}
	if err := a.budget.reserve(a.source, n); err != nil {
		return err
	}
	a.held += n
	return nil
}

// shrink gives back n of the bytes held.
func (a *bodyAccount) shrink(n int64) {
	if a == nil {
		return
	}
	a.budget.release(a.source, n)
	a.held -= n
}

// close gives back everything held: the body has been read (or not).
func (a *bodyAccount) close() {
	if a != nil {
		a.shrink(a.held)
	}
}

// sourceOf is the per-source budget's name for a client address: the IPv4
// address, or the /64 of an IPv6 one (one host commonly holds a whole /64,
// so a finer key would let it multiply its share). An address that does
// not parse (a test's) is its own source.
func sourceOf(remoteAddr string) string {
	ap, err := netip.ParseAddrPort(remoteAddr)
	if err != nil {
		return remoteAddr
	}
	addr := ap.Addr().Unmap()
	if addr.Is6() {
		p, _ := addr.Prefix(64)
		return p.String()
	}
	return addr.String()
}
