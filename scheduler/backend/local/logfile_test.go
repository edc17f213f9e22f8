package local

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestLogSinkKeepsLastNonEmptyLine(t *testing.T) {
	long := strings.Repeat("y", 2*maxLineBytes)
	tests := []struct {
		name   string
		writes []string
		want   string
	}{
		{"nothing", nil, ""},
		{"one line", []string{"hello\n"}, "hello"},
		{"blank lines after", []string{"first\n", "\n  \n", "\n"}, "first"},
		{"line split across writes", []string{"boot ", "failed: x\n"}, "boot failed: x"},
		{"unterminated last line", []string{"a\n", "Traceback: boom"}, "Traceback: boom"},
		{"carriage return progress", []string{"10%\r50%\r100%\r"}, "100%"},
		{"crlf", []string{"done\r\n"}, "done"},
		{"surrounding space trimmed", []string{"  spaced out \t\n"}, "spaced out"},
		{"long line capped", []string{long + "\n"}, long[:maxLineBytes]},
		{"several lines in one write", []string{"a\nb\nc\n"}, "c"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, err := openLogSink("", 1<<20, 1, nil, func(err error) { t.Error(err) })
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.writes {
				if n, err := s.Write([]byte(w)); n != len(w) || err != nil {
					t.Fatalf("Write = %d, %v", n, err)
				}
			}
			if got := s.LastLine(); got != tc.want {
				t.Errorf("LastLine = %q, want %q", got, tc.want)
			}
		})
	}
}

func TestLogSinkRotatesBeyondCap(t *testing.T) {
	tests := []struct {
		name      string
		existing  string // already in the log when it is opened
		writes    []string
		wantLog   string
		wantOld   string
		wantNoOld bool
	}{
		{
			name:      "under the cap",
			writes:    []string{"aaaa\n", "bbbb\n"},
			wantLog:   "aaaa\nbbbb\n",
			wantNoOld: true,
		},
		{
			name:    "write crossing the cap rotates after it",
			writes:  []string{"aaaa\n", "bbbb\n", "cccc\n"},
			wantLog: "",
			wantOld: "aaaa\nbbbb\ncccc\n",
		},
		{
			name:    "one old generation only",
			writes:  []string{"aaaaaaaaaaaa\n", "bbbbbbbbbbbb\n", "cc\n"},
			wantLog: "cc\n",
			wantOld: "bbbbbbbbbbbb\n",
		},
		{
			name:     "existing content counts",
			existing: "0123456789\n",
			writes:   []string{"dd\n", "ee\n"},
			wantLog:  "ee\n",
			wantOld:  "0123456789\ndd\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "sub", "dir", "r.log")
			if tc.existing != "" {
				os.MkdirAll(filepath.Dir(path), 0o755)
				if err := os.WriteFile(path, []byte(tc.existing), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			s, err := openLogSink(path, 12, 1, nil, func(err error) { t.Error(err) })
			if err != nil {
				t.Fatal(err)
			}
			for _, w := range tc.writes {
				s.Write([]byte(w))
			}
			if err := s.Close(); err != nil {
				t.Fatal(err)
			}
			if got, _ := os.ReadFile(path); string(got) != tc.wantLog {
				t.Errorf("log = %q, want %q", got, tc.wantLog)
			}
			old, err := os.ReadFile(path + ".1")
			switch {
			case tc.wantNoOld && !os.IsNotExist(err):
				t.Errorf("old generation exists: %q, %v", old, err)
			case !tc.wantNoOld && string(old) != tc.wantOld:
				t.Errorf("old generation = %q (%v), want %q", old, err, tc.wantOld)
			}
		})
	}
}
