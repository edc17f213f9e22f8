// Package jsonw appends JSON values to a byte slice exactly as encoding/json
// writes them (json.Marshal: HTML-safe strings, RFC 3339 times), for the few
// records encoded once per call on the hot path, where json.Marshal's
// reflection and allocations were a measurable part of a call's CPU (see
// docs/benchmarks.md). Each user holds its encoder to json.Marshal's output
// in a test.
package jsonw

import (
	"time"
	"unicode/utf8"
)

const hex = "0123456789abcdef"

// String appends s as a JSON string, escaped as json.Marshal escapes it:
// '"', '\\' and control characters, '<', '>' and '&' (HTML-safe), U+2028
// and U+2029, and each byte that is not UTF-8 as U+FFFD.
func String(dst []byte, s string) []byte {
	dst = append(dst, '"')
	start := 0
	for i := 0; i < len(s); {
		if b := s[i]; b < utf8.RuneSelf {
			if b >= 0x20 && b != '"' && b != '\\' && b != '<' && b != '>' && b != '&' {
				i++
				continue
			}
			dst = append(dst, s[start:i]...)
			switch b {
			case '\\', '"':
				dst = append(dst, '\\', b)
			case '\b':
				dst = append(dst, '\\', 'b')
			case '\f':
				dst = append(dst, '\\', 'f')
			case '\n':
				dst = append(dst, '\\', 'n')
			case '\r':
				dst = append(dst, '\\', 'r')
			case '\t':
				dst = append(dst, '\\', 't')
			default:
				dst = append(dst, '\\', 'u', '0', '0', hex[b>>4], hex[b&0xF])
			}
			i++
			start = i
			continue
		}
		c, size := utf8.DecodeRuneInString(s[i:])
		switch {
		case c == utf8.RuneError && size == 1:
			dst = append(dst, s[start:i]...)
			dst = append(dst, `\ufffd`...)
		case c == '\u2028' || c == '\u2029':
			dst = append(dst, s[start:i]...)
			dst = append(dst, '\\', 'u', '2', '0', '2', hex[c&0xF])
		default:
			i += size
			continue
		}
		i += size
		start = i
	}
	dst = append(dst, s[start:]...)
	return append(dst, '"')
}

// Time appends t as json.Marshal writes a time.Time (RFC 3339 with
// nanoseconds, quoted), or reports false, appending nothing, for a time
// json.Marshal refuses (a year outside 0-9999, a zone offset of a day or
// more): the caller then lets json.Marshal report it.
func Time(dst []byte, t time.Time) ([]byte, bool) {
	if y := t.Year(); y < 0 || y > 9999 {
		return dst, false
	}
	if _, off := t.Zone(); off <= -24*3600 || off >= 24*3600 {
		return dst, false
	}
	dst = append(dst, '"')
	dst = t.AppendFormat(dst, time.RFC3339Nano)
	return append(dst, '"'), true
}
