package store

import "unicode/utf8"

// InvalidUTF8 returns the offset of the first byte of b that is not valid
// UTF-8, or -1 when b is valid throughout. A call's inputs and outputs are
// JSON text that clients parse; the JSON scanner lets such bytes through
// inside strings, so the API and the model protocols refuse them by this
// offset rather than pass them into answers that clients then fail to read.
func InvalidUTF8(b []byte) int {
	if utf8.Valid(b) {
		return -1
	}
	for i := 0; i < len(b); {
		r, n := utf8.DecodeRune(b[i:])
		if r == utf8.RuneError && n == 1 {
			return i
		}
		i += n
	}
	return -1
}
