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

// errBodyCut is the answer to a body cut for the room of a source that
// held less (bodyBudget.victims).
func errBodyCut(max int64) error {
	return overBudget(http.StatusServiceUnavailable, budgetBodyBytes,
		"server busy: request bodies being read hold the %s they may, and this address held more than its share", sizeText(max))
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
//
// It is fair between sources: when the total is full, a source that would
// still hold no more than its share (the total over the sources holding
// bytes, itself counted) makes room by cutting the bodies of sources over
// their share, the largest holder's first, the one that best frees the
// room (bestFit). So no set of
// sources, however many addresses it has, can keep another out: issue 41's
// three addresses renewing held bodies every limits.bodyReadTimeout
// refused 9 of 10 of another client's small starts. A body cut is
// answered as a refusal by limits.bodyBytes; only a body being read
// (readBody, which can interrupt its read) is cut.
type bodyBudget struct {
	total, perSource int64

	mu       sync.Mutex
	used     int64
	bySource map[string]*sourceBodies // only sources that hold bytes now
	seq      uint64                   // accounts opened, to find the oldest
	peak     atomic.Int64             // the most used at once, for tests and benchmarks
	cuts     atomic.Int64             // bodies cut for another source's room
}

// sourceBodies is what one source holds: its bytes and the accounts that
// hold them.
type sourceBodies struct {
	held     int64
	accounts map[*bodyAccount]struct{}
}

func newBodyBudget(total, perSource int64) *bodyBudget {
	return &bodyBudget{total: total, perSource: perSource, bySource: map[string]*sourceBodies{}}
}

// check says whether n more bytes from source would fit now, without taking
// them (nor cutting anything for them): the answer to a Content-Length that
// cannot fit is a refusal before any of the body is read.
func (b *bodyBudget) check(source string, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.fitsSource(source, n); err != nil {
		return err
	}
	if b.total > 0 && b.used+n > b.total && b.victims(source, n) == nil {
		return errBodyBytes(b.total)
	}
	return nil
}

// fitsSource checks n more bytes of source against the per-source cap;
// b.mu is held.
func (b *bodyBudget) fitsSource(source string, n int64) error {
	if b.perSource > 0 && source != "" && b.heldBy(source)+n > b.perSource {
		return errBodyBytesPerSource(b.perSource)
	}
	return nil
}

// heldBy is what source holds; b.mu is held.
func (b *bodyBudget) heldBy(source string) int64 {
	if s := b.bySource[source]; s != nil {
		return s.held
	}
	return 0
}

// victims returns the bodies to cut so that n more bytes of source fit in
// the total, or nil when source may not make room: it would hold more than
// its share, or no other source holds more than its own (b.mu is held).
// The share is the total over the sources holding bytes, source counted;
// the largest holder above it loses a body first (bestFit), until there is
// room or it is within its share.
func (b *bodyBudget) victims(source string, n int64) []*bodyAccount {
	sources := len(b.bySource)
	if b.bySource[source] == nil {
		sources++
	}
	share := b.total / int64(sources)
	if b.heldBy(source)+n > share {
		return nil
	}
	need := b.used + n - b.total
	held := map[string]int64{}
	var cut []*bodyAccount
	taken := map[*bodyAccount]bool{}
	for need > 0 {
		var victim *bodyAccount
		var most int64
		for name, sb := range b.bySource {
			h, ok := held[name]
			if !ok {
				h = sb.held
			}
			if name == source || h <= share || h <= most {
				continue
			}
			if a := sb.bestFit(taken, need); a != nil {
				victim, most = a, h
			}
		}
		if victim == nil {
			return nil
		}
		taken[victim] = true
		cut = append(cut, victim)
		held[victim.source] = most - victim.held
		need -= victim.held
	}
	return cut
}

// bestFit is the account of sb to cut for need bytes: its smallest body
// that frees them (the oldest of equals), else its largest, never one in
// taken or one that cannot be cut. A small request so cuts a small body,
// not a large upload that is almost in: holding more than a share costs
// the holder its bodies one by one, in the least it can give.
func (sb *sourceBodies) bestFit(taken map[*bodyAccount]bool, need int64) *bodyAccount {
	var fit, largest *bodyAccount
	for a := range sb.accounts {
		if a.interrupt == nil || taken[a] || a.held <= 0 {
			continue
		}
		if a.held >= need && (fit == nil || a.held < fit.held || a.held == fit.held && a.seq < fit.seq) {
			fit = a
		}
		if largest == nil || a.held > largest.held || a.held == largest.held && a.seq < largest.seq {
			largest = a
		}
	}
	if fit != nil {
		return fit
	}
	return largest
}

// reserve takes n bytes for acct, or refuses them; when the total is full
// it cuts other sources' bodies for them, if acct's source is within its
// share (victims).
func (b *bodyBudget) reserve(acct *bodyAccount, n int64) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if acct.cut {
		return errBodyCut(b.total)
	}
	if err := b.fitsSource(acct.source, n); err != nil {
		return err
	}
	if b.total > 0 && b.used+n > b.total {
		victims := b.victims(acct.source, n)
		if victims == nil {
			return errBodyBytes(b.total)
		}
		for _, v := range victims {
			b.cutLocked(v)
		}
	}
	b.used += n
	sb := b.bySource[acct.source]
	if sb == nil {
		sb = &sourceBodies{accounts: map[*bodyAccount]struct{}{}}
		b.bySource[acct.source] = sb
	}
	sb.held += n
	sb.accounts[acct] = struct{}{}
	acct.held += n
	if b.used > b.peak.Load() {
		b.peak.Store(b.used)
	}
	return nil
}

// cutLocked gives back all that account a holds and interrupts its read:
// its reader sees the cut (errBodyCut) and answers it. b.mu is held.
func (b *bodyBudget) cutLocked(a *bodyAccount) {
	a.cut = true
	b.cuts.Add(1)
	b.releaseLocked(a, a.held)
	a.interrupt()
}

// release gives back n bytes of acct (none once it was cut: a cut gave
// back all it held).
func (b *bodyBudget) release(acct *bodyAccount, n int64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if !acct.cut {
		b.releaseLocked(acct, n)
	}
}

// releaseLocked gives back n bytes of acct; b.mu is held.
func (b *bodyBudget) releaseLocked(acct *bodyAccount, n int64) {
	if n == 0 {
		return
	}
	b.used -= n
	acct.held -= n
	sb := b.bySource[acct.source]
	sb.held -= n
	if acct.held == 0 {
		delete(sb.accounts, acct)
	}
	if sb.held <= 0 {
		delete(b.bySource, acct.source)
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
// Its held, cut and the budget's books are under the budget's lock.
type bodyAccount struct {
	budget *bodyBudget
	source string // "": a node of the cluster's, counted in all only
	seq    uint64
	held   int64
	// interrupt, when set, ends a read of the body under way: the
	// account may then be cut for another source's room.
	interrupt func()
	cut       bool
}

// account opens the account of a request from remoteAddr, counted against
// its source's budget too when perSource.
func (b *bodyBudget) account(remoteAddr string, perSource bool) *bodyAccount {
	if b == nil || b.total <= 0 && b.perSource <= 0 {
		return nil
	}
	b.mu.Lock()
	b.seq++
	acct := &bodyAccount{budget: b, seq: b.seq}
	b.mu.Unlock()
	if perSource {
		acct.source = sourceOf(remoteAddr)
	}
	return acct
}

// cuttable lets the budget cut this body for another source's room:
// interrupt must end the read under way (readBody sets the connection's
// read deadline to now).
func (a *bodyAccount) cuttable(interrupt func()) {
	if a != nil {
		a.budget.mu.Lock()
		a.interrupt = interrupt
		a.budget.mu.Unlock()
	}
}

// wasCut reports whether the budget cut this body for another's room.
func (a *bodyAccount) wasCut() bool {
	if a == nil {
		return false
	}
	a.budget.mu.Lock()
	defer a.budget.mu.Unlock()
	return a.cut
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
	return a.budget.reserve(a, n)
}

// shrink gives back n of the bytes held.
func (a *bodyAccount) shrink(n int64) {
	if a == nil {
		return
	}
	a.budget.release(a, n)
}

// close gives back everything held: the body has been read (or not).
func (a *bodyAccount) close() {
	if a != nil {
		a.budget.mu.Lock()
		defer a.budget.mu.Unlock()
		if !a.cut {
			a.budget.releaseLocked(a, a.held)
		}
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
