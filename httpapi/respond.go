package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/rs/zerolog"
)

// writeJSON writes v as the JSON body with the given status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		// Only a bug (an unencodable value) gets here; answer something
		// well-formed rather than half a body.
		status = http.StatusInternalServerError
		b = []byte(`{"error":{"code":"internal","message":"internal error: encoding the response failed"}}`)
	}
	writeBody(w, status, b)
}

// writeBody writes an encoded JSON body.
func writeBody(w http.ResponseWriter, status int, b []byte) {
	b = append(b, '\n')
	h := w.Header()
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	w.WriteHeader(status)
	_, _ = w.Write(b) // a failed write means the client is gone
}

// errorBody is the JSON error shape of the project and admin endpoints.
type errorBody struct {
	Error errorDetail `json:"error"`
}

type errorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// writeError answers err on the project and admin endpoints, logging it when
// it is internal (the one place such an error is handled).
func writeError(w http.ResponseWriter, r *http.Request, log zerolog.Logger, err error) {
	id := requestIDOf(w)
	status, code, msg, internal := apiError(err, id)
	if internal {
		log.Error().Err(err).Str("request_id", id).Str("method", r.Method).
			Str("path", r.URL.Path).Msg("request failed")
	}
	writeJSON(w, status, errorBody{errorDetail{code, msg}})
}

// maxPresize bounds the buffer readBody sets aside from a Content-Length
// before any of the body has arrived: the header is only a claim, and a
// client that announces the full cap and sends nothing must not make the
// server reserve it. A longer body grows the buffer as its bytes arrive.
const maxPresize = 64 << 10

// readBody reads the whole request body, at most limit bytes; a longer body
// gives an *http.MaxBytesError. Chunked bodies (unknown length) are fine.
// With a Content-Length of up to maxPresize the buffer is sized once.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	if r.ContentLength > limit {
		return nil, &http.MaxBytesError{Limit: limit}
	}
	body := http.MaxBytesReader(w, r.Body, limit)
	size := 512
	if r.ContentLength > 0 {
		size = int(min(r.ContentLength+1, maxPresize)) // +1: room to see EOF without growing
	}
	buf := make([]byte, 0, size)
	for {
		if len(buf) == cap(buf) {
			buf = grow(buf, r.ContentLength)
		}
		n, err := body.Read(buf[len(buf):cap(buf)])
		buf = buf[:len(buf)+n]
		if err == io.EOF {
			return buf, nil
		}
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				return nil, tooLarge
			}
			return nil, badRequest("could not read the request body: %v", err)
		}
	}
}

// grow returns buf with room for more. Without a Content-Length it doubles.
// With one it grows fourfold, and straight to the announced length (and a
// byte to see EOF) once that is within twice the step, so a large body is
// read into about one buffer of its size (a 4 MiB body: 64 KiB, 256 KiB,
// 1 MiB, then its own size, 1.3 copies in all, where doubling cost 3): the
// request's one copy of its payload. What is set aside stays within eight
// times what has arrived, so an announced length still reserves nothing a
// client has not sent.
func grow(buf []byte, contentLength int64) []byte {
	next := 2 * cap(buf)
	if contentLength > int64(len(buf)) {
		next = 4 * cap(buf)
		if int64(next) > contentLength/2 {
			next = int(contentLength + 1)
		}
	}
	nb := make([]byte, len(buf), max(next, len(buf)+1))
	copy(nb, buf)
	return nb
}

// firstByte returns the first non-whitespace byte of b, or 0 when b is blank.
func firstByte(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c
	}
	return 0
}
