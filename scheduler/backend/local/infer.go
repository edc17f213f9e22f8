package replica

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

const (
	// maxReplyBytes caps a reply read into memory.
	maxReplyBytes = 64 << 20
	// errorBodyBytes is how much of a non-2xx reply HTTPError keeps.
	errorBodyBytes = 1 << 10
	// tracebackBytes is how much of a potassium exception's traceback is read.
	tracebackBytes = 64 << 10
	// exitGrace is how long a failed call waits to see whether the process is
	// exiting, which turns a broken connection into ErrExited.
	exitGrace = time.Second
)

// ErrExited is returned by Infer when the model process exits during the call (or had
// exited before it). The error wraps it with the exit status.
var ErrExited = errors.New("model process exited")

// ErrInvalidReply is returned by Infer, wrapped with detail, when a 2xx reply is not
// JSON or is larger than 64 MiB.
var ErrInvalidReply = errors.New("invalid reply from model")

// HTTPError is returned by Infer when the model answers with a non-2xx status.
type HTTPError struct {
	Status int    // HTTP status code
	Body   string // the first KiB of the reply body
}

// Error implements error.
func (e *HTTPError) Error() string {
	if e.Body == "" {
		return fmt.Sprintf("model replied HTTP %d", e.Status)
	}
	return fmt.Sprintf("model replied HTTP %d: %s", e.Status, e.Body)
}

// ExceptionError reports an exception raised by the model's handler, for protocols
// that tell it apart from other errors (potassium's text/plain 500 with a traceback).
// The http protocol never returns it: its failures are HTTPErrors.
type ExceptionError struct {
	LastLine string // the last line of the traceback, e.g. "ValueError: bad input"
}

// Error implements error.
func (e *ExceptionError) Error() string { return "model raised an exception: " + e.LastLine }

// Infer posts inputs to the model's InferPath as application/json and returns the
// reply body, which is valid JSON. Errors: *HTTPError for a non-2xx reply,
// ErrInvalidReply (wrapped) for a reply that is not JSON or too large, ErrExited
// (wrapped) when the process exits during the call; ctx's error is returned as is.
// For protocol potassium the request carries a fresh X-Banana-Request-Id, and a 500
// with a text/plain body (the handler's traceback) is an *ExceptionError instead.
func (p *Process) Infer(ctx context.Context, inputs json.RawMessage) (json.RawMessage, error) {
	if err := p.exitedErr(); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, p.baseURL+p.spec.InferPath, bytes.NewReader(inputs))
	if err != nil {
		return nil, fmt.Errorf("infer: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	potassium := p.spec.Protocol == ProtocolPotassium
	if potassium {
		req.Header.Set("X-Banana-Request-Id", uuid.NewString())
	}
	resp, finish, err := p.send(ctx, req, len(inputs))
	if err != nil {
		return nil, p.callFailed(ctx, err)
	}
	clean := false // the body was read to its end: the connection may be reused
	defer func() { finish(clean) }()

	if potassium && resp.StatusCode == http.StatusInternalServerError && isTextPlain(resp.Header.Get("Content-Type")) {
		body, err := io.ReadAll(io.LimitReader(resp.Body, tracebackBytes))
		if err != nil {
			return nil, p.callFailed(ctx, err)
		}
		clean = len(body) < tracebackBytes
		tb := validUTF8(body)
		p.log.Debug().Str("request_id", req.Header.Get("X-Banana-Request-Id")).Str("traceback", tb).Msg("model raised an exception")
		return nil, &ExceptionError{LastLine: validUTF8(truncate([]byte(lastTracebackLine(tb)), errorBodyBytes))}
	}

	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		body, err := io.ReadAll(io.LimitReader(resp.Body, errorBodyBytes))
		if err != nil {
			return nil, p.callFailed(ctx, err)
		}
		clean = len(body) < errorBodyBytes
		return nil, &HTTPError{Status: resp.StatusCode, Body: validUTF8(body)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, p.maxReply+1))
	if err != nil {
		return nil, p.callFailed(ctx, err)
	}
	if int64(len(body)) > p.maxReply {
		return nil, fmt.Errorf("%w: reply larger than %d bytes", ErrInvalidReply, p.maxReply)
	}
	clean = true // shorter than the limit: the body ended
	if !json.Valid(body) {
		return nil, fmt.Errorf("%w: reply is not JSON: %q", ErrInvalidReply, truncate(body, 200))
	}
	return body, nil
}

// send sends req through the connection pool, or through http.Client when the body
// is too large for the pool (see fastPathMaxBody). finish must be called once the
// body has been read, with clean set when it was read to its end.
func (p *Process) send(ctx context.Context, req *http.Request, bodyLen int) (*http.Response, func(clean bool), error) {
	if bodyLen <= fastPathMaxBody {
		return p.conns.roundTrip(ctx, req)
	}
	resp, err := p.client.Do(req)
	if err != nil {
		return nil, nil, err
	}
	// net/http reuses the connection on its own once the body was read to EOF.
	return resp, func(bool) { resp.Body.Close() }, nil
}

// callFailed classifies a transport error: the context's own error passes through,
// a process that exits at about the same time makes it ErrExited.
func (p *Process) callFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	t := time.NewTimer(exitGrace)
	defer t.Stop()
	select {
	case <-p.exited:
		return p.exitedErr()
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return fmt.Errorf("infer: %w", err)
	}
}

// exitedErr returns ErrExited, wrapped with the exit status, once the process has
// exited, and nil before.
func (p *Process) exitedErr() error {
	select {
	case <-p.exited:
	default:
		return nil
	}
	if p.exitErr != nil {
		return fmt.Errorf("%w (%v)", ErrExited, p.exitErr)
	}
	return ErrExited
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
