package local

import (
	"fmt"
	"io"
	"strings"
	"unicode/utf8"
)

// Model output is untrusted text: a model may print escape sequences that
// clear the operator's terminal, move the cursor to fake a prompt, set the
// window title or write the clipboard (OSC 52), and bidirectional overrides
// that make text read other than it is. The log files keep the bytes as the
// model wrote them; everything read back for people (TailLog and FollowLog,
// which `inferd logs` and the status page show, and LastLogLine, which goes
// into call errors) shows such characters escaped, as \x1b or \u009b, so that
// they are seen and never act.

// unsafeRune reports whether r may act on a terminal or change how the text
// around it reads: C0 controls but tab (newline is the line break, handled
// by the callers), DEL, the C1 controls (U+009B is a one-character CSI), and
// the bidirectional embeddings, overrides and isolates.
func unsafeRune(r rune) bool {
	switch {
	case r == '\t':
		return false
	case r < 0x20, r == 0x7f, r >= 0x80 && r <= 0x9f:
		return true
	case r >= 0x202a && r <= 0x202e, r >= 0x2066 && r <= 0x2069:
		return true
	}
	return false
}

// appendEscaped appends r, or its escape when it is unsafe.
func appendEscaped(dst []byte, r rune) []byte {
	switch {
	case !unsafeRune(r):
		return utf8.AppendRune(dst, r)
	case r < 0x80:
		return fmt.Appendf(dst, `\x%02x`, r)
	default:
		return fmt.Appendf(dst, `\u%04x`, r)
	}
}

// escapeLine returns s, one line, with bytes that are not UTF-8 replaced by
// U+FFFD and unsafe characters escaped (a newline in s is escaped too: a
// line stays one line).
func escapeLine(s string) string {
	s = strings.ToValidUTF8(s, "\uFFFD")
	clean := true
	for _, r := range s {
		if unsafeRune(r) {
			clean = false
			break
		}
	}
	if clean {
		return s
	}
	out := make([]byte, 0, len(s)+16)
	for _, r := range s {
		out = appendEscaped(out, r)
	}
	return string(out)
}

// escapeWriter escapes the model output written through it on its way to w,
// as it arrives: newlines pass, a carriage return ends a line as it does in
// TailLog (so "\r" cannot overwrite a line shown already), bytes that are not
// UTF-8 become U+FFFD (a run of them one), unsafe characters are escaped. A character or "\r\n"
// cut between two writes is held back until the next.
type escapeWriter struct {
	w    io.Writer
	held []byte // the start of a character, or a "\r", cut at the end of the last write
	bad  bool   // the last byte written was not UTF-8
	out  []byte // scratch
}

func newEscapeWriter(w io.Writer) *escapeWriter { return &escapeWriter{w: w} }

// Write escapes p and writes it to w; it reports all of p written unless w
// fails.
func (e *escapeWriter) Write(p []byte) (int, error) {
	b := p
	if len(e.held) > 0 {
		b = append(e.held, p...)
		e.held = nil
	}
	out := e.out[:0]
	for i := 0; i < len(b); {
		c := b[i]
		switch {
		case c == '\n':
			e.bad = false
			out = append(out, '\n')
			i++
			continue
		case c == '\r' && i+1 == len(b):
			e.held = append(e.held, '\r') // a "\r\n" cut in two?
			i++
			continue
		case c == '\r':
			if b[i+1] == '\n' {
				i++ // "\r\n" is one line break
			}
			e.bad = false
			out = append(out, '\n')
			i++
			continue
		}
		if !utf8.FullRune(b[i:]) {
			e.held = append(e.held, b[i:]...)
			break
		}
		r, n := utf8.DecodeRune(b[i:])
		i += n
		bad := r == utf8.RuneError && n == 1
		if !bad || !e.bad { // a run of bytes that are not UTF-8 is one U+FFFD, as in TailLog
			out = appendEscaped(out, r)
		}
		e.bad = bad
		continue
	}
	e.out = out
	if _, err := e.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}
