package respond

import (
	"net/http"
	"runtime/debug"
	"time"

	"github.com/google/uuid"
	"github.com/julienschmidt/httprouter"
	"github.com/rs/zerolog"
)

// RequestIDHeader carries the request id both ways.
const RequestIDHeader = "X-Request-Id"

// Recorder remembers the status and size of a response for the access
// log, and whether the header is out (after which a panic can no longer be
// answered).
type Recorder struct {
	http.ResponseWriter
	status      int
	bytes       int64
	wroteHeader bool
	route       string // the matched route pattern, set by SetRoute
}

// WriteHeader records the first status written.
func (w *Recorder) WriteHeader(code int) {
	if !w.wroteHeader && code >= 200 {
		w.status = code
		w.wroteHeader = true
	}
	w.ResponseWriter.WriteHeader(code)
}

// Write counts the bytes written.
func (w *Recorder) Write(b []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

// SetRoute records the route pattern that took the request, for the
// metrics (a pattern, not the raw path, keeps their label set bounded).
func (w *Recorder) SetRoute(pattern string) { w.route = pattern }

// Answered tells the metrics how the request was answered
// (metrics.Answered).
func (w *Recorder) Answered() (route string, status int) { return w.route, w.status }

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *Recorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// WithRequestLog gives every request an id (the caller's X-Request-Id when
// it is sane, else a new UUID), echoes it in the response, and logs one
// line per request. It never logs headers, keys or bodies.
func WithRequestLog(next http.Handler, log zerolog.Logger) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := r.Header.Get(RequestIDHeader)
		if !saneRequestID(id) {
			id = uuid.NewString()
		}
		w.Header().Set(RequestIDHeader, id)
		rec := &Recorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		log.Info().
			Str("method", r.Method).
			Str("path", Truncate(r.URL.Path, 200)).
			Int("status", rec.status).
			Float64("duration_ms", float64(time.Since(start).Microseconds())/1000).
			Int64("bytes", rec.bytes).
			Str("request_id", id).
			Msg("request")
	})
}

// RequestID returns the id that WithRequestLog gave the request (it sits
// in the response header, which saves a context value per request).
func RequestID(w http.ResponseWriter) string {
	return w.Header().Get(RequestIDHeader)
}

// saneRequestID accepts 1–64 characters of [A-Za-z0-9._-]: anything else
// could forge log lines or headers.
func saneRequestID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9',
			c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Truncate cuts s to n bytes, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// LogPanic logs a recovered panic with its stack and reports whether a
// response may still be written.
func LogPanic(w http.ResponseWriter, r *http.Request, log zerolog.Logger, v any) bool {
	if v == http.ErrAbortHandler {
		panic(v) // net/http's way to abort a response silently
	}
	log.Error().Str("request_id", RequestID(w)).Str("method", r.Method).
		Str("path", Truncate(r.URL.Path, 200)).Interface("panic", v).
		Bytes("stack", debug.Stack()).Msg("handler panicked")
	rw, ok := w.(*Recorder)
	return !ok || !rw.wroteHeader
}

// Refuse answers a request no route takes with status, code and msg.
type Refuse func(w http.ResponseWriter, r *http.Request, status int, code, msg string)

// Refused is the Refuse of the JSON error shape.
func Refused(w http.ResponseWriter, _ *http.Request, status int, code, msg string) {
	JSON(w, status, Refusal(code, msg))
}

// NewRouter returns an httprouter that never redirects and answers unknown
// routes and wrong methods with refuse, and panics with onPanic.
func NewRouter(onPanic func(http.ResponseWriter, *http.Request, any), refuse Refuse) *httprouter.Router {
	r := httprouter.New()
	r.RedirectTrailingSlash = false // a POST would get a 307, which clients do not follow
	r.RedirectFixedPath = false
	r.HandleMethodNotAllowed = true
	r.HandleOPTIONS = true
	r.GlobalOPTIONS = http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.WriteHeader(http.StatusNoContent) // Allow is set by the router
	})
	r.NotFound = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse(w, r, http.StatusNotFound, CodeNotFound, "no such endpoint: "+r.Method+" "+Truncate(r.URL.Path, 200))
	})
	r.MethodNotAllowed = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		refuse(w, r, http.StatusMethodNotAllowed, CodeMethodNotAllowed,
			"method "+r.Method+" not allowed; allowed: "+w.Header().Get("Allow"))
	})
	r.PanicHandler = onPanic
	return r
}
