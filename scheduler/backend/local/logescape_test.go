package local

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"inferd/scheduler/backend"
)

// What a hostile model prints, and how an operator sees it.
var hostileOutput = []struct {
	name, raw, shown string
}{
	{"clear screen", "\x1b[2J\x1b[Hbye", `\x1b[2J\x1b[Hbye`},
	{"clipboard write (OSC 52)", "\x1b]52;c;cm0gLXJmIC8K\x07done", `\x1b]52;c;cm0gLXJmIC8K\x07done`},
	{"window title", "\x1b]0;root@prod\x1b\\", `\x1b]0;root@prod\x1b\`},
	{"one-byte CSI (C1)", "\u009b31mred", `\u009b31mred`},
	{"backspaces over text", "safe\b\b\b\bevil", `safe\x08\x08\x08\x08evil`},
	{"bidi override", "user\u202Egnp.exe", `user\u202egnp.exe`},
	{"bell and DEL", "\a\x7f", `\x07\x7f`},
	{"bytes that are not UTF-8", "ok\xff\xfe!", "ok\uFFFD!"},
	{"tabs and UTF-8 stay", "a\tb ünïcødé 模型", "a\tb ünïcødé 模型"},
}

func TestEscapeLineShowsControlsWithoutActingOnThem(t *testing.T) {
	for _, tc := range hostileOutput {
		t.Run(tc.name, func(t *testing.T) {
			if got := escapeLine(tc.raw); got != tc.shown {
				t.Fatalf("escapeLine(%q) = %q, want %q", tc.raw, got, tc.shown)
			}
		})
	}
}

func TestEscapeWriterEscapesOutputCutAnywhere(t *testing.T) {
	raw := "start\r\nprogress 10%\rprogress 99%\r\n\x1b[2J\u009b1m模型\xff\xfe\r"
	want := "start\nprogress 10%\nprogress 99%\n" + `\x1b[2J\u009b1m模型` + "\uFFFD\n"
	for cut := 0; cut <= len(raw); cut++ {
		var out bytes.Buffer
		e := newEscapeWriter(&out)
		for _, part := range []string{raw[:cut], raw[cut:], "\n"} {
			if n, err := e.Write([]byte(part)); err != nil || n != len(part) {
				t.Fatalf("cut at %d: Write = %d, %v", cut, n, err)
			}
		}
		if out.String() != want {
			t.Fatalf("cut at %d: %q, want %q", cut, out.String(), want)
		}
	}
}

// The log file keeps what the model wrote; TailLog, FollowLog and
// LastLogLine, which inferd logs, the status page and call errors show,
// escape it.
func TestLogReadersEscapeWhatTheModelPrinted(t *testing.T) {
	b := testBackend(t)
	var script strings.Builder
	for _, tc := range hostileOutput {
		script.WriteString("printf '%s\\n' '" + strings.ReplaceAll(tc.raw, "'", `'\''`) + "'\n")
	}
	p := startModel(t, b, shSpec("hostile", script.String()))
	waitExited(t, p)
	l := backend.Log{Team: "team", Project: "proj-hostile", Replica: "hostile"}
	lines, _, err := b.TailLog(l, 100)
	if err != nil {
		t.Fatal(err)
	}
	if len(lines) != len(hostileOutput) {
		t.Fatalf("lines = %q", lines)
	}
	for i, tc := range hostileOutput {
		if lines[i] != tc.shown {
			t.Errorf("%s: TailLog line %q, want %q", tc.name, lines[i], tc.shown)
		}
	}
	if got, want := p.LastLogLine(), hostileOutput[len(hostileOutput)-1].shown; got != want {
		t.Errorf("LastLogLine = %q, want %q", got, want)
	}
	raw, err := os.ReadFile(LogPath(b.cfg.LogDir, l.Team, l.Project, l.Replica))
	if err != nil || !bytes.Contains(raw, []byte("\x1b[2J")) {
		t.Errorf("the log file does not keep the raw bytes: %q, %v", raw, err)
	}
	// Follow from the start of the file, until the last line has come.
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.FollowLog(ctx, l, 0, &out) }()
	last := hostileOutput[len(hostileOutput)-1].shown + "\n"
	waitFor(t, "the followed log to end", func() bool { return strings.HasSuffix(out.String(), last) })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	var want strings.Builder
	for _, tc := range hostileOutput {
		want.WriteString(tc.shown + "\n")
	}
	if got := out.String(); got != want.String() {
		t.Errorf("FollowLog wrote %q, want %q", got, want.String())
	}
}
