package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how Missing ended the test instead of
// ending the real one. Skip and Fatal end the calling goroutine, as in testing.
type recorder struct {
	testing.TB
	skipped, failed string
}

func (r *recorder) Helper() {}
func (r *recorder) Skip(args ...any) {
	r.skipped = args[0].(string)
	runtime.Goexit()
}
func (r *recorder) Fatalf(format string, args ...any) {
	r.failed = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// missing runs Missing on a recorder in its own goroutine (Goexit ends only
// that one) and returns what it recorded.
func missing(format string, args ...any) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		Missing(r, format, args...)
	}()
	<-done
	return r
}

func TestMissingSkipsWhenNotRequired(t *testing.T) {
	t.Setenv(RequireVar, "")
	r := missing("node is not installed")
	if r.failed != "" || !strings.Contains(r.skipped, "node is not installed") {
		t.Errorf("Missing without %s: skipped %q, failed %q; want a skip naming node", RequireVar, r.skipped, r.failed)
	}
}

func TestMissingFailsWhenRequired(t *testing.T) {
	t.Setenv(RequireVar, "1")
	r := missing("%s cannot import flask", "/usr/bin/python3")
	if r.skipped != "" || !strings.Contains(r.failed, "/usr/bin/python3 cannot import flask") {
		t.Fatalf("Missing with %s=1: skipped %q, failed %q; want a failure naming what is missing", RequireVar, r.skipped, r.failed)
	}
}

func TestParseMetrics(t *testing.T) {
	got, err := ParseMetrics([]byte("# HELP x a help\n# TYPE x counter\nx 3\n\ny{a=\"b c\"} 1.5e+06\nz_count 0\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]float64{"x": 3, `y{a="b c"}`: 1.5e6, "z_count": 0}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("ParseMetrics = %v, want %v", got, want)
	}
	for _, bad := range []string{"novalue\n", "x notanumber\n"} {
		if _, err := ParseMetrics([]byte(bad)); err == nil {
			t.Errorf("ParseMetrics(%q) took it", bad)
		}
	}
}
