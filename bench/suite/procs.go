package main

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"inferd/bench/payload"
)

// proc is a child process the suite started and stops at the end.
type proc struct {
	name string
	cmd  *exec.Cmd
}

func start(name, logPath string, env []string, argv ...string) (*proc, error) {
	log, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = log, log
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		log.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	log.Close() // the child has its own copy
	return &proc{name: name, cmd: cmd}, nil
}

// stop sends SIGTERM to the process group and waits up to 20 s, then kills
// it.
func (p *proc) stop() {
	pgid := p.cmd.Process.Pid
	syscall.Kill(-pgid, syscall.SIGTERM)
	done := make(chan struct{})
	go func() { p.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		syscall.Kill(-pgid, syscall.SIGKILL)
		<-done
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// freePort asks the kernel for a free loopback port.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// waitHTTP polls url until it answers 2xx or timeout passes.
func waitHTTP(ctx context.Context, method, url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for {
		req, _ := http.NewRequestWithContext(ctx, method, url, nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode < 300 {
				return nil
			}
			err = fmt.Errorf("HTTP %d", resp.StatusCode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer within %v: %w", url, timeout, err)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// rssBytes reads a process's resident set size.
func rssBytes(pid int) (int64, error) { return payload.RSS(pid) }

// metricSum adds up the samples of a Prometheus metric whose name and labels
// start with prefix, e.g. `inferd_replicas{project="cold"`.
func metricSum(ctx context.Context, base, prefix string) (float64, error) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/metrics", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	var sum float64
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, prefix) {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			return 0, fmt.Errorf("metric line %q: %w", line, err)
		}
		sum += v
	}
	return sum, sc.Err()
}

// waitMetric polls until metricSum satisfies ok.
func waitMetric(ctx context.Context, base, prefix string, timeout time.Duration, ok func(float64) bool) (float64, error) {
	deadline := time.Now().Add(timeout)
	for {
		v, err := metricSum(ctx, base, prefix)
		if err == nil && ok(v) {
			return v, nil
		}
		if time.Now().After(deadline) {
			return v, fmt.Errorf("metric %s: still %v after %v (err %v)", prefix, v, timeout, err)
		}
		select {
		case <-ctx.Done():
			return v, ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// bootRecord is one line of a no-op model's boot log.
type bootRecord struct {
	started, listening time.Time
}

func readBootLog(path string) ([]bootRecord, error) {
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		return nil, err
	}
	var out []bootRecord
	for line := range bytes.Lines(b) {
		f := strings.Fields(string(line))
		if len(f) != 2 {
			continue
		}
		s, err1 := strconv.ParseInt(f[0], 10, 64)
		l, err2 := strconv.ParseInt(f[1], 10, 64)
		if err1 != nil || err2 != nil {
			return nil, fmt.Errorf("boot log %s: bad line %q", path, line)
		}
		out = append(out, bootRecord{time.Unix(0, s), time.Unix(0, l)})
	}
	return out, nil
}

// diskBytes is how much of the disk path takes. bbolt grows its file by
// ftruncate in 16 MiB steps, leaving a sparse tail, so the apparent size moves
// in steps that hide what a call costs; the blocks written do not.
func diskBytes(path string) int64 {
	fi, err := os.Stat(path)
	if err != nil {
		return 0
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return st.Blocks * 512
	}
	return fi.Size()
}

func mustAbs(p string) string {
	a, err := filepath.Abs(p)
	if err != nil {
		panic(err)
	}
	return a
}
