// Package payload measures what large payloads cost inferd, for `make
// bench` (bench/suite) and the end-to-end tests (e2e/payloads_test.go), so
// both measure the same way: a queue of calls with megabytes of inputs, and
// many concurrent checks of one call with a large result, with the daemon's
// peak RSS (VmHWM, reset between phases) and CPU time read from /proc, and a
// plain io.Copy of the same bytes over loopback to compare the checks' CPU
// with.
package payload

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Peak returns a process's peak resident set size (VmHWM) in bytes.
func Peak(pid int) (int64, error) { return statusBytes(pid, "VmHWM") }

// RSS returns a process's resident set size (VmRSS) in bytes.
func RSS(pid int) (int64, error) { return statusBytes(pid, "VmRSS") }

// statusBytes reads a size in kB from /proc/<pid>/status.
func statusBytes(pid int, field string) (int64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no %s for pid %d", field, pid)
}

// ResetPeak sets a process's VmHWM back to its current RSS, so that the
// next Peak is the peak of what follows (writing 5 to clear_refs; Linux
// 4.0+, a process of the same user).
func ResetPeak(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// CPU returns the CPU time a process's threads have run, to the
// nanosecond: the sum of /proc/<pid>/task/*/schedstat (the clock ticks of
// /proc/<pid>/stat are too coarse for a phase of a second).
func CPU(pid int) (time.Duration, error) {
	tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
	if err != nil {
		return 0, err
	}
	var total int64
	for _, task := range tasks {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, task.Name()))
		if err != nil {
			continue // the thread has exited
		}
		f := strings.Fields(string(b))
		if len(f) == 0 {
			continue
		}
		ns, err := strconv.ParseInt(f[0], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("schedstat of %d/%s: %w", pid, task.Name(), err)
		}
		total += ns
	}
	return time.Duration(total), nil
}

// Client calls inferd's inference API.
type Client struct {
	Base, APIKey, ModelKey string
	HTTP                   *http.Client // nil: keepAlive
}

// keepAlive keeps a connection per client goroutine (net/http's default
// keeps two per host, and the checks would measure new connections).
var keepAlive = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256, Proxy: nil}}

func (c *Client) http() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return keepAlive
}

// Answer is what a start or check answer says, less its outputs.
type Answer struct {
	Message  string `json:"message"`
	CallID   string `json:"callID"`
	Finished bool   `json:"finished"`
	Bytes    int    // length of the whole answer
}

func (c *Client) post(ctx context.Context, path string, body []byte) (Answer, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Base+path, bytes.NewReader(body))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http().Do(req)
	if err != nil {
		return Answer{}, err
	}
	defer resp.Body.Close()
	// Only the head of the answer is decoded: the fields come before
	// modelOutputs, and decoding megabytes of outputs would measure the
	// client, not the daemon.
	br := bufio.NewReaderSize(resp.Body, 4096)
	head, _ := br.Peek(4096)
	n, err := io.Copy(io.Discard, br)
	if err != nil {
		return Answer{}, fmt.Errorf("%s: read answer: %w", path, err)
	}
	var a Answer
	if i := bytes.Index(head, []byte(`,"modelOutputs"`)); i > 0 {
		head = append(head[:i:i], '}')
	}
	if err := json.Unmarshal(head, &a); err != nil {
		return Answer{}, fmt.Errorf("%s: answer %.200q: %w", path, head, err)
	}
	a.Bytes = int(n)
	return a, nil
}

// Inputs returns model inputs of about size bytes: extra (JSON members
// with a trailing comma, e.g. `"raw":"{}",`, or ""), call number i, and
// padding.
func Inputs(extra string, i, size int) []byte {
	b := fmt.Appendf(nil, `{%s"i":%d,"pad":"`, extra, i)
	b = append(b, bytes.Repeat([]byte("A"), max(size-len(b)-2, 0))...)
	return append(b, `"}`...)
}

// Start starts a call with inputs and returns the answer.
func (c *Client) Start(ctx context.Context, inputs []byte, startOnly bool) (Answer, error) {
	body := fmt.Appendf(nil, `{"apiKey":%q,"modelKey":%q,"startOnly":%t,"modelInputs":`, c.APIKey, c.ModelKey, startOnly)
	body = append(append(body, inputs...), '}')
	return c.post(ctx, "/start/v4", body)
}

// Check checks a call, waiting for it with longPoll.
func (c *Client) Check(ctx context.Context, callID string, longPoll bool) (Answer, error) {
	return c.post(ctx, "/check/v4", fmt.Appendf(nil, `{"apiKey":%q,"callID":%q,"longPoll":%t}`, c.APIKey, callID, longPoll))
}

// Queue starts n calls of about size bytes of inputs (see Inputs) with
// startOnly, from clients goroutines at once, and returns their ids in
// call order and how many were answered still pending (queued, booting or
// running).
func (c *Client) Queue(ctx context.Context, extra string, n, size, clients int) (ids []string, pending int, err error) {
	ids = make([]string, n)
	var (
		mu   sync.Mutex
		next int
	)
	p, err := fanOut(clients, func() (int64, error) {
		var pending int64
		for {
			mu.Lock()
			i := next
			next++
			mu.Unlock()
			if i >= n {
				return pending, nil
			}
			a, err := c.Start(ctx, Inputs(extra, i, size), true)
			if err == nil && a.CallID == "" {
				err = fmt.Errorf("start %d: %s", i, a.Message)
			}
			if err != nil {
				return pending, err
			}
			ids[i] = a.CallID // each i is one goroutine's
			if !a.Finished {
				pending++
			}
		}
	})
	return ids, int(p), err
}

// Wait long-polls each call until it has finished and fails unless every
// one succeeded.
func (c *Client) Wait(ctx context.Context, ids []string) error {
	for _, id := range ids {
		for {
			a, err := c.Check(ctx, id, true)
			if err != nil {
				return err
			}
			if a.Finished {
				if a.Message != "success" {
					return fmt.Errorf("call %s: %s", id, a.Message)
				}
				break
			}
		}
	}
	return nil
}

// Checks makes rounds checks of the finished call id from each of clients
// goroutines at once and returns the bytes of answers read. Every answer
// must be a success of at least minBytes.
func (c *Client) Checks(ctx context.Context, id string, clients, rounds, minBytes int) (int64, error) {
	return fanOut(clients, func() (int64, error) {
		var n int64
		for range rounds {
			a, err := c.Check(ctx, id, false)
			n += int64(a.Bytes)
			if err == nil && (a.Message != "success" || a.Bytes < minBytes) {
				err = fmt.Errorf("check %s: %q, %d bytes", id, a.Message, a.Bytes)
			}
			if err != nil {
				return n, err
			}
		}
		return n, nil
	})
}

// fanOut runs fn on clients goroutines at once and sums what they return.
func fanOut(clients int, fn func() (int64, error)) (int64, error) {
	var (
		mu    sync.Mutex
		total int64
		errs  []error
	)
	var wg sync.WaitGroup
	for range clients {
		wg.Go(func() {
			n, err := fn()
			mu.Lock()
			defer mu.Unlock()
			total += n
			if err != nil {
				errs = append(errs, err)
			}
		})
	}
	wg.Wait()
	return total, errors.Join(errs...)
}

// ServeCopy is the baseline the checks are compared with: for each byte a
// client sends on a connection, it writes size bytes back with io.Copy, the
// least a server can do to send them. It returns when ln is closed.
func ServeCopy(ln net.Listener, size int) error {
	buf := bytes.Repeat([]byte("A"), size)
	for {
		conn, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			defer conn.Close()
			var one [1]byte
			for {
				if _, err := io.ReadFull(conn, one[:]); err != nil {
					return
				}
				if _, err := io.Copy(conn, bytes.NewReader(buf)); err != nil {
					return
				}
			}
		}()
	}
}

// CopyClients asks a ServeCopy server at addr for size bytes rounds times
// from each of clients connections at once and returns the bytes read.
func CopyClients(addr string, clients, rounds, size int) (int64, error) {
	return fanOut(clients, func() (int64, error) {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			return 0, err
		}
		defer conn.Close()
		var n int64
		for range rounds {
			if _, err := conn.Write([]byte{1}); err != nil {
				return n, err
			}
			m, err := io.CopyN(io.Discard, conn, int64(size))
			n += m
			if err != nil {
				return n, err
			}
		}
		return n, nil
	})
}

// MiB formats bytes as MiB with one decimal.
func MiB(b int64) string { return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20)) }

// PerMB is CPU time per MB (10^6 bytes) moved.
func PerMB(cpu time.Duration, bytes int64) time.Duration {
	if bytes == 0 {
		return 0
	}
	return time.Duration(float64(cpu) / (float64(bytes) / 1e6))
}

// ListenAndServeCopy is the main of the baseline process: it listens on
// loopback, writes its address and a newline to w, and serves (ServeCopy)
// until the process is killed.
func ListenAndServeCopy(w io.Writer, size int) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Fprintln(w, ln.Addr())
	return ServeCopy(ln, size)
}

// CopyBaseline starts cmd, a process that runs ListenAndServeCopy with
// size, reads its reply rounds times from each of clients connections and
// returns the process's CPU time per MB sent; cmd is killed at the end. A
// process of its own, so that its CPU time, like the daemon's, is the
// sender's alone.
func CopyBaseline(cmd *exec.Cmd, clients, rounds, size int) (time.Duration, error) {
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("copy server: %w", err)
	}
	pid := cmd.Process.Pid
	cpu0, err := CPU(pid)
	if err != nil {
		return 0, err
	}
	n, err := CopyClients(strings.TrimSpace(addr), clients, rounds, size)
	if err != nil {
		return 0, err
	}
	cpu1, err := CPU(pid)
	if err != nil {
		return 0, err
	}
	return PerMB(cpu1-cpu0, n), nil
}
