package main

import (
	"fmt"
	"io"
	"os"
	"runtime"
	"strings"
	"time"
)

// report collects figures and prints them as Markdown.
type report struct {
	header    []string
	tables    []string
	rows      [][4]string // figure, value, target, met
	errors    []string
	idleRSS   int64
	warmStart time.Duration // p50 of a warm sync start at c=1
	// coldOn and coldOff are the cold boot overhead, p50, with the replica
	// sandbox on (the default) and off.
	coldOn, coldOff time.Duration
}

func (r *report) machine() {
	load, _ := os.ReadFile("/proc/loadavg")
	r.header = append(r.header,
		fmt.Sprintf("Machine: %s, %d CPUs (GOMAXPROCS %d), %s/%s, %s; load average at start: %s",
			hostname(), runtime.NumCPU(), runtime.GOMAXPROCS(0), runtime.GOOS, runtime.GOARCH, runtime.Version(),
			strings.TrimSpace(string(load))),
		"Run at "+time.Now().UTC().Format(time.RFC3339))
}

func (r *report) add(figure, value, target string, met bool) {
	verdict := ""
	if target != "" {
		verdict = "met"
		if !met {
			verdict = "**not met**"
		}
	}
	r.rows = append(r.rows, [4]string{figure, value, target, verdict})
}

func (r *report) errorf(format string, args ...any) {
	r.errors = append(r.errors, fmt.Sprintf(format, args...))
}

// table renders one side-by-side comparison; ratios are to latBase for
// latency and to tputBase for throughput.
func (r *report) table(title string, res map[string]*merged, latBase, tputBase string, order ...string) {
	var b strings.Builder
	fmt.Fprintf(&b, "### %s\n\n", title)
	b.WriteString("| target | requests | errors | req/s | p50 | p95 | p99 | p50 ÷ " + latBase + " | req/s ÷ " + tputBase + " |\n")
	b.WriteString("|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
	lb, tb := res[latBase], res[tputBase]
	for _, name := range order {
		m := res[name]
		fmt.Fprintf(&b, "| %s | %d | %d | %.0f | %s | %s | %s | %.2f× | %s |\n", name, m.requests, m.err,
			m.throughput(), dur(m.pct(50)), dur(m.pct(95)), dur(m.pct(99)),
			float64(m.pct(50))/float64(lb.pct(50)), pct(m.throughput()/tb.throughput()))
		if m.firstErr != "" {
			r.errorf("%s: %d errors, first: %s", name, m.err, m.firstErr)
		}
	}
	r.costs(&b, res, order)
	r.tables = append(r.tables, b.String())
}

// costs adds, under a table, what each inferd target cost the daemon:
// CPU per call (schedstat of its threads) and its group commits.
func (r *report) costs(b *strings.Builder, res map[string]*merged, order []string) {
	head := false
	for _, name := range order {
		m := res[name]
		if m.cpu == 0 && m.commits.n == 0 {
			continue
		}
		if !head {
			b.WriteString("\n| inferd target | CPU per call | calls per commit | commit, mean | commits busy |\n|---|---:|---:|---:|---:|\n")
			head = true
		}
		calls := float64(m.requests + m.warm)
		perCommit, mean := 0.0, time.Duration(0)
		if m.commits.n > 0 {
			perCommit = calls / m.commits.n
			mean = time.Duration(m.commits.secs / m.commits.n * 1e9)
		}
		fmt.Fprintf(b, "| %s | %s | %.1f | %s | %s |\n", name, dur(m.cpuPerCall()), perCommit, dur(mean),
			pct(m.commits.secs/m.elapsed.Seconds()))
	}
}

func (r *report) print(w io.Writer) {
	fmt.Fprintln(w, "## inferd benchmark")
	fmt.Fprintln(w)
	for _, h := range r.header {
		fmt.Fprintf(w, "%s  \n", h)
	}
	fmt.Fprintln(w)
	for _, t := range r.tables {
		fmt.Fprintln(w, t)
	}
	fmt.Fprintln(w, "### Figures and targets")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| figure | measured | target | |")
	fmt.Fprintln(w, "|---|---:|---|---|")
	for _, row := range r.rows {
		fmt.Fprintf(w, "| %s | %s | %s | %s |\n", row[0], row[1], row[2], row[3])
	}
	if len(r.errors) > 0 {
		fmt.Fprintln(w, "\n### Errors")
		fmt.Fprintln(w)
		for _, e := range r.errors {
			fmt.Fprintln(w, "- "+e)
		}
	}
}

func dur(d time.Duration) string {
	neg := d < 0
	if neg {
		d = -d
	}
	var s string
	switch {
	case d >= time.Second:
		s = fmt.Sprintf("%.2f s", d.Seconds())
	case d >= time.Millisecond:
		s = fmt.Sprintf("%.2f ms", float64(d)/1e6)
	default:
		s = fmt.Sprintf("%.0f µs", float64(d)/1e3)
	}
	if neg {
		s = "−" + s
	}
	return s
}

func pct(f float64) string { return fmt.Sprintf("%.0f%%", f*100) }

func mib(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }
