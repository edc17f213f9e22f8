package respond

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
)

// DecodeObject parses body, which must be one JSON object, into v.
func DecodeObject(body []byte, v any) error {
	switch FirstByte(body) {
	case 0:
		return ErrEmptyBody
	case '{':
	default:
		if !json.Valid(body) {
			return MalformedJSON(json.Unmarshal(body, v))
		}
		return ErrNotObject
	}
	if err := json.Unmarshal(body, v); err != nil {
		return MalformedJSON(err)
	}
	return nil
}

// IsAbsent reports whether a field is missing or null.
func IsAbsent(raw json.RawMessage) bool {
	return len(raw) == 0 || string(raw) == "null"
}

// FirstByte returns the first non-whitespace byte of b, or 0 when b is blank.
func FirstByte(b []byte) byte {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\r', '\n':
			continue
		}
		return c
	}
	return 0
}

// QueryInt reads the positive integer query parameter name, def when it is
// absent, at most limit.
func QueryInt(r *http.Request, name string, def, limit int) (int, error) {
	s := r.URL.Query().Get(name)
	if s == "" {
		return def, nil
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		return 0, BadRequest("%s must be a positive integer, got %q", name, Truncate(s, 32))
	}
	return min(n, limit), nil
}

// ReadBody reads the whole request body, at most limit bytes; a longer body
// gives an *http.MaxBytesError. It counts against no budget: the admin
// socket's bodies use it (the public API's are read within its budgets).
func ReadBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	if r.Body == nil {
		return nil, nil
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var tooLarge *http.MaxBytesError
	if err != nil && !errors.As(err, &tooLarge) {
		return nil, BadRequest("could not read the request body: %v", err)
	}
	return body, err
}
