// Package protocol speaks to model servers: the http protocol and Banana's
// potassium (see docs/protocols.md). A [Client] checks a model's health and
// sends it calls over kept-alive connections; it knows nothing of how the
// model was started or where it runs, so any replica backend can use it,
// handing it the dialer that reaches its models.
package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/rs/zerolog"

	"inferd/openai"
	"inferd/scheduler/backend"
	"inferd/store"
)

const (
	// maxReplyBytes caps a reply read into memory.
	maxReplyBytes = 64 << 20
	// errorBodyBytes is how much of a non-2xx reply HTTPError keeps.
	errorBodyBytes = 1 << 10
	// tracebackBytes is how much of a potassium exception's traceback is read.
	tracebackBytes = 64 << 10
	// maxIdleConns is the keep-alive pool per model: at least as many
	// connections as calls a replica may serve at once (a project's
	// concurrency goes up to store.MaxConcurrency, and can be raised while
	// the replica runs), so that no finished call's connection is closed
	// only to be dialled again for the next. Idle connections exist only up
	// to the peak of calls in flight and close after idleConnTimeout.
	maxIdleConns = 1000
	// idleConnTimeout closes a keep-alive connection unused this long.
	idleConnTimeout = 90 * time.Second
	// healthDrainBytes is how much of a health reply is read; a longer one
	// closes the connection.
	healthDrainBytes = 4 << 10
	// maxHeaderBytes caps a reply's status line and headers. A model is not
	// trusted: without a cap, one sending an endless header would be read
	// into memory until the daemon ran out of it.
	maxHeaderBytes = 1 << 20
)

// dialFunc connects to a model, as net.Dialer.DialContext does.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// Config says where a model listens and which protocol it speaks.
type Config struct {
	Protocol   string // store.ProtocolHTTP ("" = it), store.ProtocolPotassium or store.ProtocolOpenAI
	HealthPath string // GET; 2xx = ready. "" = /healthz (/__status__ for potassium)
	InferPath  string // POST; "" = /
	BatchPath  string // POST of a batch (InferBatch); "" = InferPath
	Addr       string // host:port
	// Dial connects to Addr; nil = a TCP dial (each attempt's timeout is the
	// pool's, at most ConnectTimeout: dial.go). A backend
	// whose models are reached some other way (from inside a network
	// namespace, say) hands its own.
	Dial func(ctx context.Context, network, addr string) (net.Conn, error)
	// MaxReplyBytes caps a reply read into memory; 0 = 64 MiB.
	MaxReplyBytes int64
	// Log gets a potassium exception's traceback, at debug level.
	Log zerolog.Logger
}

// Client talks to one model server. Its methods are safe for concurrent use.
type Client struct {
	cfg       Config
	potassium bool
	openai    bool
	baseURL   string       // http://ADDR
	client    *http.Client // calls with a large body (see fastPathMaxBody)
	conns     *connPool    // health checks and the other calls: see connPool
	// targets are the request targets of the spec's paths (see target);
	// healthReq is the health check, the same bytes every time.
	targets   map[string]string
	healthReq poolRequest
}

// New returns a client for the model described by cfg, or an error when cfg
// names a protocol or a path that cannot be used. It connects to nothing yet.
func New(cfg Config) (*Client, error) {
	// The model spec's defaults, from their one source.
	m := store.ModelSpec{Protocol: cfg.Protocol, HealthPath: cfg.HealthPath, InferPath: cfg.InferPath, BatchPath: cfg.BatchPath}.WithDefaults()
	cfg.Protocol, cfg.HealthPath, cfg.InferPath, cfg.BatchPath = m.Protocol, m.HealthPath, m.InferPath, m.BatchPath
	if cfg.MaxReplyBytes <= 0 {
		cfg.MaxReplyBytes = maxReplyBytes
	}
	if cfg.Dial == nil {
		cfg.Dial = (&net.Dialer{Timeout: ConnectTimeout}).DialContext
	}
	switch {
	case cfg.Protocol != store.ProtocolHTTP && cfg.Protocol != store.ProtocolPotassium && cfg.Protocol != store.ProtocolOpenAI:
		return nil, fmt.Errorf("unsupported protocol %q (supported: %q, %q, %q)", cfg.Protocol, store.ProtocolHTTP, store.ProtocolPotassium, store.ProtocolOpenAI)
	case !strings.HasPrefix(cfg.HealthPath, "/"):
		return nil, fmt.Errorf("health path %q does not start with /", cfg.HealthPath)
	case !strings.HasPrefix(cfg.InferPath, "/"):
		return nil, fmt.Errorf("infer path %q does not start with /", cfg.InferPath)
	case !strings.HasPrefix(cfg.BatchPath, "/"):
		return nil, fmt.Errorf("batch path %q does not start with /", cfg.BatchPath)
	}
	transport := &http.Transport{
		Proxy:                  nil, // the model is ours to reach: never a proxy from the daemon's env
		DialContext:            cfg.Dial,
		MaxIdleConns:           maxIdleConns,
		MaxIdleConnsPerHost:    maxIdleConns,
		IdleConnTimeout:        idleConnTimeout,
		MaxResponseHeaderBytes: maxHeaderBytes,
	}
	client := &http.Client{
		Transport: transport, // no timeout: each call's ctx decides
		// A redirect is the model's answer, never an address to send the
		// call's inputs to: following it would let a model make inferd
		// re-POST them anywhere (see docs/security.md).
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
	c := &Client{
		cfg:       cfg,
		potassium: cfg.Protocol == store.ProtocolPotassium,
		openai:    cfg.Protocol == store.ProtocolOpenAI,
		baseURL:   "http://" + cfg.Addr,
		client:    client,
		conns:     newConnPool(cfg.Addr, cfg.Dial, maxIdleConns, idleConnTimeout),
		targets:   map[string]string{},
	}
	for _, path := range []string{cfg.HealthPath, cfg.InferPath, cfg.BatchPath} {
		target, err := c.target(path)
		if err != nil {
			return nil, fmt.Errorf("path %q: %w", path, err)
		}
		c.targets[path] = target
	}
	c.healthReq = poolRequest{method: http.MethodGet, url: c.baseURL + cfg.HealthPath,
		head: requestHead(http.MethodGet, cfg.Addr, c.targets[cfg.HealthPath], -1, ""), probe: true}
	return c, nil
}

// Close closes the idle connections; calls made later dial afresh and keep
// nothing.
func (c *Client) Close() {
	c.client.CloseIdleConnections()
	c.conns.close()
}

// Healthy makes one health check: GET HealthPath answered 2xx within ctx.
func (c *Client) Healthy(ctx context.Context) bool {
	status, err := c.Health(ctx)
	return err == nil && status >= 200 && status < 300
}

// Health makes one health check and returns the status GET HealthPath
// answered, or the error of a check that got no answer (refused, timed
// out), so that a backend can say why a model is not ready.
func (c *Client) Health(ctx context.Context) (int, error) {
	// Through the pool, so that the connection the model was found ready on
	// carries its first call.
	resp, finish, err := c.conns.roundTrip(ctx, c.healthReq)
	if err != nil {
		return 0, fmt.Errorf("health check: %w", err)
	}
	// Drain a little so the connection can be reused for the next check or call.
	n, err := io.Copy(io.Discard, io.LimitReader(resp.Body, healthDrainBytes))
	finish(err == nil && n < healthDrainBytes)
	return resp.StatusCode, nil
}

// HealthPath is the path health checks GET, defaults applied.
func (c *Client) HealthPath() string { return c.cfg.HealthPath }

// TransportError is returned by Infer when the exchange with the model broke
// (refused, reset, cut short) rather than the model answering. The caller
// may know more: a backend that sees the model end at about the same time
// reports backend.ErrExited instead.
type TransportError struct{ Err error }

// Error implements error.
func (e *TransportError) Error() string { return "infer: " + e.Err.Error() }

// Unwrap returns the underlying error.
func (e *TransportError) Unwrap() error { return e.Err }

// Infer posts inputs to the model's InferPath as application/json and returns
// the reply body, which is valid JSON. Errors: *backend.HTTPError for a
// non-2xx reply (a redirect included: none is followed), backend.ErrInvalidReply
// (wrapped) for a reply that is not JSON, too large or with headers over
// maxHeaderBytes, *TransportError when the exchange broke; ctx's error is
// returned as is. A reply that is JSON but not valid UTF-8 is ErrInvalidReply
// too, naming the offset of the first bad byte. A reply of protocol http with
// Content-Type application/x-ndjson streams: its lines go to the context's
// req.Stream as they arrive, and the result is the array of the lines
// (see readStream). A call with a route (req.Route) goes to that
// route (see inferPath). For protocol potassium the request carries a fresh
// X-Banana-Request-Id, and a 500 with a text/plain body (the handler's
// traceback) is a *backend.ExceptionError instead. For protocol openai a
// text/event-stream reply streams (readEventStream), and the usage a reply
// reports goes to the context's backend.TokenMeter.
func (c *Client) Infer(ctx context.Context, req backend.Request) (json.RawMessage, error) {
	if out, ok := c.answersItself(req.Route); ok {
		return out, nil
	}
	return c.post(ctx, c.inferPath(req.Route), req.Inputs, req.Stream, req.Meter, true)
}

// post sends body to path as a call (Infer) or a batch (InferBatch) and
// reads the reply as Infer describes; a streamed reply is refused unless
// mayStream.
func (c *Client) post(ctx context.Context, path string, body []byte, stream backend.Stream, meter backend.TokenMeter, mayStream bool) (json.RawMessage, error) {
	var requestID string
	if c.potassium {
		requestID = uuid.NewString()
	}
	resp, finish, err := c.send(ctx, path, body, requestID)
	if err != nil {
		if headersTooLarge(err) {
			return nil, fmt.Errorf("%w: reply headers larger than %d bytes", backend.ErrInvalidReply, maxHeaderBytes)
		}
		return nil, broken(ctx, err)
	}
	clean := false // the body was read to its end: the connection may be reused
	defer func() { finish(clean) }()

	if c.potassium && resp.StatusCode == http.StatusInternalServerError && isTextPlain(resp.Header.Get("Content-Type")) {
		body, err := io.ReadAll(io.LimitReader(resp.Body, tracebackBytes))
		if err != nil {
			return nil, broken(ctx, err)
		}
		clean = len(body) < tracebackBytes
		tb := validUTF8(body)
		c.cfg.Log.Debug().Str("request_id", requestID).Str("traceback", tb).Msg("model raised an exception")
		return nil, &backend.ExceptionError{LastLine: validUTF8(truncate([]byte(lastTracebackLine(tb)), errorBodyBytes))}
	}

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, err := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes))
		if err != nil {
			return nil, broken(ctx, err)
		}
		clean = len(body) < errorBodyBytes
		return nil, &backend.HTTPError{Status: resp.StatusCode, Body: validUTF8(body), RetryAfter: retryAfter(resp.Header)}
	}
	if c.openai && openai.IsEventStream(resp.Header.Get("Content-Type")) {
		if !mayStream {
			return nil, fmt.Errorf("%w: a batch reply must be one JSON object, not a stream", backend.ErrInvalidReply)
		}
		out, ok, err := readEventStream(ctx, resp.Body, c.cfg.MaxReplyBytes, stream, meter)
		clean = ok
		return out, err
	}
	if !c.potassium && !c.openai && isNDJSON(resp.Header.Get("Content-Type")) {
		if !mayStream {
			return nil, fmt.Errorf("%w: a batch reply must be one JSON object, not a stream", backend.ErrInvalidReply)
		}
		out, ok, err := readStream(ctx, resp.Body, c.cfg.MaxReplyBytes, stream)
		clean = ok
		return out, err
	}
	limit := c.cfg.MaxReplyBytes
	reply, err := readReply(resp, limit)
	if errors.Is(err, errReplyTooLarge) {
		return nil, fmt.Errorf("%w: reply larger than %d bytes", backend.ErrInvalidReply, limit)
	}
	if err != nil {
		return nil, broken(ctx, err)
	}
	clean = true // within the limit: the body ended
	if !json.Valid(reply) {
		return nil, fmt.Errorf("%w: reply is not JSON: %q", backend.ErrInvalidReply, truncate(reply, 200))
	}
	if i := store.InvalidUTF8(reply); i >= 0 {
		return nil, fmt.Errorf("%w: reply is not valid UTF-8 at byte %d", backend.ErrInvalidReply, i)
	}
	if c.openai {
		meterReply(reply, meter)
	}
	return reply, nil
}

// send posts body to path, as application/json with requestID as its
// X-Banana-Request-Id when set: through the connection pool, written as
// net/http would write it (requestHead), or through http.Client when the
// body is too large for the pool (see fastPathMaxBody). finish must be
// called once the body has been read, with clean set when it was read to its
// end.
func (c *Client) send(ctx context.Context, path string, body []byte, requestID string) (*http.Response, func(clean bool), error) {
	target, err := c.target(path)
	if err != nil {
		return nil, nil, fmt.Errorf("infer: %w", err)
	}
	if len(body) <= fastPathMaxBody {
		var extra []string
		if requestID != "" {
			extra = []string{"X-Banana-Request-Id: " + requestID + "\r\n"}
		}
		return c.conns.roundTrip(ctx, poolRequest{
			method: http.MethodPost, url: c.baseURL + path, body: body,
			head: requestHead(http.MethodPost, c.cfg.Addr, target, len(body), "application/json", extra...),
		})
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.baseURL+path, bytes.NewReader(body))
	if err != nil {
		return nil, nil, fmt.Errorf("infer: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if requestID != "" {
		req.Header.Set("X-Banana-Request-Id", requestID)
	}
	resp, err := c.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	// net/http reuses the connection on its own once the body was read to EOF.
	return resp, func(bool) { resp.Body.Close() }, nil
}

// target is the request target of a request to path: what net/http writes
// on the request line for http://ADDR+path (escaped as url.URL.RequestURI
// escapes it). The paths of the model spec are worked out once (New); a
// route's when its call is sent.
func (c *Client) target(path string) (string, error) {
	if t, ok := c.targets[path]; ok {
		return t, nil
	}
	u, err := url.Parse(c.baseURL + path)
	if err != nil {
		return "", err
	}
	return u.RequestURI(), nil
}

// errReplyTooLarge is readReply's error for a body over its limit.
var errReplyTooLarge = errors.New("reply too large")

// readReply reads resp's body, at most limit bytes, into one buffer: the only
// copy of the reply inferd makes before handing it on. A body that says its
// length is read straight into a buffer of exactly that size (a reply of
// megabytes is read once and held once, not grown by doubling), and one that
// says it is over the limit is refused before a byte is read; a body of
// unknown length (chunked, or gunzipped) grows a buffer as it comes, as
// io.ReadAll does.
func readReply(resp *http.Response, limit int64) ([]byte, error) {
	n := resp.ContentLength
	if n > limit {
		return nil, errReplyTooLarge
	}
	if n >= 0 {
		body := make([]byte, n)
		if _, err := io.ReadFull(resp.Body, body); err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF // a length of n was announced
			}
			return nil, err
		}
		// The body must end here: read its end so that net/http sees it
		// read whole and keeps the connection, and refuse more bytes than
		// announced.
		var one [1]byte
		if m, err := resp.Body.Read(one[:]); m > 0 || (err != nil && err != io.EOF) {
			if err == nil {
				err = errors.New("reply longer than its Content-Length")
			}
			return nil, err
		}
		return body, nil
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, err
	}
	if int64(len(body)) > limit {
		return nil, errReplyTooLarge
	}
	return body, nil
}

// headersTooLarge reports whether a failed exchange was a reply whose
// headers went over maxHeaderBytes: the pool's errHeadersTooLarge, or
// net/http's error for the same (which has no sentinel of its own).
func headersTooLarge(err error) bool {
	return errors.Is(err, errHeadersTooLarge) || strings.Contains(err.Error(), "server response headers exceeded")
}

// broken classifies a failed exchange: the context's own error passes
// through, anything else is a *TransportError.
func broken(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return &TransportError{Err: err}
}

// isTextPlain reports whether a Content-Type header is text/plain.
func isTextPlain(ct string) bool {
	mt, _, err := mime.ParseMediaType(ct)
	return err == nil && mt == "text/plain"
}

// truncate returns at most n bytes of b.
func truncate(b []byte, n int) []byte {
	if len(b) > n {
		return b[:n]
	}
	return b
}

// validUTF8 returns b as a string, dropping bytes that are not UTF-8 (a KiB cut can
// split a character).
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return string(bytes.ToValidUTF8(b, nil))
}

// lastTracebackLine returns the last non-empty line of a traceback, trimmed, e.g.
// "ValueError: bad prompt".
func lastTracebackLine(body string) string {
	lines := strings.Split(strings.TrimRight(body, "\r\n\t "), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if l := strings.TrimSpace(lines[i]); l != "" {
			return l
		}
	}
	return ""
}

// retryAfter is a reply's Retry-After header when it is one a client can
// use (delay-seconds or an HTTP date, RFC 9110 10.2.3), as sent; else "".
func retryAfter(h http.Header) string {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" || len(v) > 64 {
		return ""
	}
	if _, err := strconv.ParseUint(v, 10, 32); err == nil {
		return v
	}
	if _, err := http.ParseTime(v); err == nil {
		return v
	}
	return ""
}
