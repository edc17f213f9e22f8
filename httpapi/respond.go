package httpapi

import (
	"errors"
	"io"
	"net/http"
	"os"
)

// maxPresize bounds the buffer readBody sets aside from a Content-Length
// before any of the body has arrived: the header is only a claim, and a
// client that announces the full cap and sends nothing must not make the
// server reserve it. A longer body grows the buffer as its bytes arrive.
const maxPresize = 64 << 10

// readBody reads the whole request body, at most limit bytes; a longer body
// gives an *http.MaxBytesError. Chunked bodies (unknown length) are fine.
// With a Content-Length of up to maxPresize the buffer is sized once. It
// counts against no budget: the admin socket's bodies use it; the API's use
// api.readBody.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	return readBodyWithin(w, r, limit, nil)
}

// readBody reads the body of an API request within the body budgets: the
// bytes being read at once, in all and per client address, and the time to
// send it (set on the connection by withEdge). A refusal names its budget.
// A body another node of the cluster forwards counts in all only: that node
// forwards many clients' bodies from one address, each within its own
// budgets.
func (a *api) readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := readBodyWithin(w, r, limit, a.bodyAccount(r))
	return body, a.bodyRefusal(w, err)
}

// bodyAccount opens the account of r's body in the body budgets.
func (a *api) bodyAccount(r *http.Request) *bodyAccount {
	return a.bodies.account(r.RemoteAddr, !a.fromNode(r))
}

// bodyRefusal is err as the caller is told it: a body past its read
// deadline names limits.bodyReadTimeout, and a refusal by a budget is
// counted, gets its Retry-After, and closes the connection.
func (a *api) bodyRefusal(w http.ResponseWriter, err error) error {
	if errors.Is(err, errBodyDeadline) {
		err = errBodyReadTimeout(a.opts.Limits.BodyReadTimeout)
	}
	if be, ok := err.(*budgetError); ok {
		a.refused(be.budget)
		setRetryAfter(w, err)
		// Answer now and close: net/http would otherwise read what is left
		// of a body (up to 256 KiB) before it answers, at the client's pace.
		w.Header().Set("Connection", "close")
	}
	return err
}

// readBodyWithin is readBody counting the buffer against acct (nil: no
// budget). What the buffer takes is reserved before it is allocated, and
// given back once the body is read: what a handler then does with it is
// bounded by the budgets of that work (waits, queued bytes).
func readBodyWithin(w http.ResponseWriter, r *http.Request, limit int64, acct *bodyAccount) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	// A body announced larger than the budget has room for is refused
	// before a byte of it is read or a buffer set aside.
	if err := acct.check(r.ContentLength); err != nil {
		return nil, err
	}
	defer acct.close()
	body := http.MaxBytesReader(w, r.Body, limit)
	size := 512
	if r.ContentLength > 0 {
		size = int(min(r.ContentLength+1, maxPresize)) // +1: room to see EOF without growing
	}
	if err := acct.grow(int64(size)); err != nil {
		return nil, err
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			next := growSize(buf, r.ContentLength, limit)
			if err := acct.grow(int64(next)); err != nil {
				return nil, err
			}
			nb := make([]byte, len(buf), next)
			copy(nb, buf)
			acct.shrink(int64(cap(buf)))
			buf = nb
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			return nil, bodyReadError(err)
		}
	}
}

// bodyReadError is what the caller is told of a body that could not be read.
func bodyReadError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return tooLarge
	}
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errBodyDeadline
	}
	return badRequest("could not read the request body: %v", err)
}

// errBodyDeadline is a body that did not arrive by the read deadline
// withEdge set: api.readBody names the budget.
var errBodyDeadline = badRequest("request body not received in time")

// growSize is the capacity of buf's next buffer, for a body of at most
// limit bytes. Without a Content-Length it doubles, up to the limit and a
// byte to see EOF. With one it grows fourfold, and straight to the
// announced length (and that byte) once that is within twice the step, so a
// large body is read into about one buffer of its size (a 4 MiB body:
// 64 KiB, 256 KiB, 1 MiB, then its own size, 1.3 copies in all, where
// doubling cost 3): the request's one copy of its payload. What is set aside
// stays within eight times what has arrived, so an announced length still
// reserves nothing a client has not sent; and the old and the new buffer
// together, while one is copied into the other, stay within about one and a
// half times the body (twice the limit for one of unknown length).
func growSize(buf []byte, contentLength, limit int64) int {
	next := min(2*int64(cap(buf)), limit+1)
	if contentLength > int64(len(buf)) {
		next = 4 * int64(cap(buf))
		if next > contentLength/2 {
			next = contentLength + 1
		}
	}
	return int(max(next, int64(len(buf))+1))
}
