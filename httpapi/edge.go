package httpapi

import (
	"io"
	"net/http"
	"time"
)

// withEdge is what every API request meets before a handler reads a byte of
// its body. A connection on the probes' reserve (conns.go) is served
// /healthz, /readyz and /metrics once, and refused anything else. A request
// with a body gets its read deadline (limits.bodyReadTimeout: the time to
// send the body, where readHeaderTimeout bounds the headers), and its
// connection counts as sending until the body is in, so that a client
// trickling a body is closed for room as one trickling its headers is.
func (a *api) withEdge(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		lc := connOf(r.Context())
		if lc != nil && lc.reserved {
			w.Header().Set("Connection", "close") // the slot serves one probe
			if !isProbePath(r.URL.Path) {
				a.refuseOnReserve(w, r, lc.lim.max)
				return
			}
		}
		// net/http clears the read deadline itself once a body is read to
		// its end (its background read, which notices a client that hangs
		// up, must not time out), so the deadline bounds the body only. A
		// request without a body gets none: its background read has begun.
		if r.Body != nil && r.Body != http.NoBody {
			if t := a.opts.Limits.BodyReadTimeout; t > 0 {
				_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(t))
			}
			if lc != nil {
				lc.lim.bodyArriving(lc)
				r.Body = &arrivingBody{ReadCloser: r.Body, lc: lc}
			}
		}
		next.ServeHTTP(w, r)
	})
}

// isProbePath reports whether path is one a reserved connection is served.
func isProbePath(path string) bool {
	switch path {
	case "/healthz", "/readyz", "/metrics":
		return true
	}
	return false
}

// refuseOnReserve answers a request other than a probe that came on a
// reserved connection: every connection under the cap is being served.
func (a *api) refuseOnReserve(w http.ResponseWriter, r *http.Request, capacity int) {
	a.refused(budgetConnections)
	err := overBudget(http.StatusServiceUnavailable, budgetConnections,
		"server busy: all %d connections are being served; this one is kept for /healthz, /readyz and /metrics", capacity)
	setRetryAfter(w, err)
	if isInferencePath(r.URL.Path) {
		a.fail(w, r, err)
		return
	}
	writeError(w, r, a.log, err)
}

// arrivingBody tells the connection limit when a request's body is in.
type arrivingBody struct {
	io.ReadCloser
	lc   *limitedConn
	done bool
}

func (b *arrivingBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF && !b.done {
		b.done = true
		b.lc.lim.bodyArrived(b.lc)
	}
	return n, err
}

// refused counts a refusal by budget.
func (a *api) refused(budget string) { a.opts.Metrics.BudgetRefused(budget) }
