package testenv

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"
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

func TestSlackStretchesDeadlinesByTheLargerOfTheVariableAndTheLoadPerCore(t *testing.T) {
	for _, tc := range []struct {
		name     string
		env      string
		load     float64
		haveLoad bool
		cores    int
		want     float64
		says     string
	}{
		{"a quiet machine", "", 0.5, true, 2, 1, "deadlines ×1.0 (load average 0.50 on 2 cores"},
		{"load below the cores", "", 1.9, true, 2, 1, "×1.0"},
		{"load of six per core", "", 12, true, 2, 6, "deadlines ×6.0 (load average 12.00 on 2 cores"},
		{"load past the cap", "", 200, true, 2, maxLoadSlack, "×8.0"},
		{"the variable over a quiet load", "3", 0.1, true, 2, 3, "INFERD_TEST_SLACK=3"},
		{"the load over the variable", "2", 10, true, 2, 5, "×5.0"},
		{"the variable past the load cap", "20", 200, true, 2, 20, "×20.0"},
		{"no load average", "", 0, false, 2, 1, "×1.0"},
		{"a variable that is no number", "fast", 0, true, 2, 1, `INFERD_TEST_SLACK="fast" ignored`},
		{"a variable below one", "0.5", 0, true, 2, 1, `INFERD_TEST_SLACK="0.5" ignored`},
		{"a variable that is not a number at all", "NaN", 0, true, 2, 1, `ignored`},
		{"no cores reported", "", 3, true, 0, 3, "on 1 cores"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := decideSlack(tc.env, tc.load, tc.haveLoad, tc.cores)
			if s.f != tc.want || !strings.Contains(s.String(), tc.says) {
				t.Errorf("factor %g, report %q; want %g and a report saying %q", s.f, s, tc.want, tc.says)
			}
		})
	}
}

func TestWaitedSaysWhatItWaitedForAndHowLoadedTheMachineIs(t *testing.T) {
	msg := Waited(2*time.Second, "the replica ready")
	for _, want := range []string{"the replica ready", "2s ×", "cores now", "deadlines ×"} {
		if !strings.Contains(msg, want) {
			t.Errorf("Waited: %q lacks %q", msg, want)
		}
	}
	if _, ok := loadAverage(); ok && !strings.Contains(msg, "load average ") {
		t.Errorf("Waited: %q does not give the load average", msg)
	}
}
