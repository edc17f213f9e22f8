package store

import "testing"

func TestInvalidUTF8NamesTheFirstBadByte(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want int
	}{
		{`{"prompt":"hi"}`, -1},
		{`{"prompt":"模型"}`, -1},
		{"", -1},
		{"\xff", 0},
		{`{"prompt":"` + "\xc3\x28" + `"}`, 11},    // a 2-byte start with a bad continuation
		{`{"a":"é","b":"` + "\xe6\xa8" + `"}`, 15}, // a character cut short
	} {
		if got := InvalidUTF8([]byte(tc.in)); got != tc.want {
			t.Errorf("InvalidUTF8(%q) = %d, want %d", tc.in, got, tc.want)
		}
	}
}
