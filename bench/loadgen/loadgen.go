// Package loadgen drives HTTP load at a model server, a reverse proxy in
// front of one, or inferd, and measures latency and throughput. It is the
// engine of the bench/load command and of the bench/suite that `make bench`
// runs.
//
// Two ways to drive load:
//   - closed loop (Rate 0): Concurrency workers each send a request, wait for
//     its answer and send the next;
//   - open loop (Rate > 0): requests start at fixed intervals whether or not
//     earlier ones have answered (at most Concurrency in flight; an arrival
//     that finds none free counts as dropped). Latency is measured from the
//     scheduled start, so a stalled server cannot hide its queueing delay
//     (no coordinated omission).
//
// Latencies are kept whole and sorted at the end, so percentiles are exact.
package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Target says what one request is.
type Target string

const (
	// Model posts the inputs to URL and expects a 2xx JSON reply: a model
	// server directly, or a reverse proxy in front of one.
	Model Target = "model"
	// Start posts a synchronous /start/v4 and expects message "success".
	Start Target = "start"
	// StartOnly posts /start/v4 with startOnly, then /check/v4 with longPoll
	// until the call has finished; one request is the whole exchange.
	StartOnly Target = "startonly"
	// OpenAI posts /v1/chat/completions with the key as its Bearer token and
	// ModelKey as the model's name, and expects a 2xx reply: the OpenAI door.
	OpenAI Target = "openai"
)

// Config is one load run.
type Config struct {
	Target      Target
	URL         string // model URL, or inferd's base URL (http://host:port)
	APIKey      string // inferd targets only
	ModelKey    string // inferd targets only
	Inputs      json.RawMessage
	Concurrency int           // workers (closed loop) or most in flight (open loop); default 1
	Rate        float64       // requests per second; 0 = closed loop
	Duration    time.Duration // run this long ...
	Count       int           // ... or until this many requests have ended (whichever is set; Count wins)
	Warmup      int           // requests per worker sent first and not measured
	Client      *http.Client  // default: one keep-alive transport sized to Concurrency
}

// Result is what a run measured.
type Result struct {
	Target      Target        `json:"target"`
	Concurrency int           `json:"concurrency"`
	Rate        float64       `json:"rate,omitempty"`
	Requests    int           `json:"requests"` // ended, errors included
	Errors      int           `json:"errors"`
	Dropped     int           `json:"dropped,omitempty"` // open loop: no free slot at an arrival
	Elapsed     time.Duration `json:"elapsedNs"`
	Throughput  float64       `json:"throughput"` // successful requests per second
	P50         time.Duration `json:"p50Ns"`
	P95         time.Duration `json:"p95Ns"`
	P99         time.Duration `json:"p99Ns"`
	Max         time.Duration `json:"maxNs"`
	Mean        time.Duration `json:"meanNs"`
	FirstError  string        `json:"firstError,omitempty"`
	latencies   []time.Duration
}

// Latencies returns the sorted latencies of the successful requests.
func (r *Result) Latencies() []time.Duration { return r.latencies }

// String is a one-line summary.
func (r *Result) String() string {
	s := fmt.Sprintf("%-9s c=%-3d n=%-7d err=%-4d %8.0f req/s  p50 %-9s p95 %-9s p99 %-9s max %s",
		r.Target, r.Concurrency, r.Requests, r.Errors, r.Throughput,
		round(r.P50), round(r.P95), round(r.P99), round(r.Max))
	if r.Dropped > 0 {
		s += fmt.Sprintf(" dropped=%d", r.Dropped)
	}
	if r.FirstError != "" {
		s += " first error: " + r.FirstError
	}
	return s
}

func round(d time.Duration) time.Duration {
	switch {
	case d >= time.Second:
		return d.Round(time.Millisecond)
	case d >= time.Millisecond:
		return d.Round(10 * time.Microsecond)
	default:
		return d.Round(time.Microsecond)
	}
}

// NewClient returns a client whose transport keeps up to conns connections
// alive to one host, so every worker reuses its own connection.
func NewClient(conns int) *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        conns,
		MaxIdleConnsPerHost: conns,
		IdleConnTimeout:     time.Minute,
	}}
}

// Run drives the load until Count requests have ended, Duration has passed
// or ctx ends.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 1
	}
	if cfg.Count <= 0 && cfg.Duration <= 0 {
		return nil, errors.New("loadgen: set a count or a duration")
	}
	if len(cfg.Inputs) == 0 {
		cfg.Inputs = json.RawMessage(`{"prompt":"hello"}`)
	}
	if cfg.Client == nil {
		cfg.Client = NewClient(cfg.Concurrency)
	}
	do, err := requester(cfg)
	if err != nil {
		return nil, err
	}
	for range cfg.Warmup {
		var wg sync.WaitGroup
		for range cfg.Concurrency {
			wg.Go(func() { _ = do(ctx) })
		}
		wg.Wait()
	}
	if cfg.Duration > 0 && cfg.Count <= 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.Duration)
		defer cancel()
	}
	rec := newRecorder(cfg.Concurrency)
	start := time.Now()
	if cfg.Rate > 0 {
		openLoop(ctx, cfg, do, rec)
	} else {
		closedLoop(ctx, cfg, do, rec)
	}
	return rec.result(cfg, time.Since(start)), nil
}

func closedLoop(ctx context.Context, cfg Config, do func(context.Context) error, rec *recorder) {
	var left atomic.Int64
	left.Store(int64(cfg.Count))
	var wg sync.WaitGroup
	for w := range cfg.Concurrency {
		wg.Go(func() {
			for ctx.Err() == nil {
				if cfg.Count > 0 && left.Add(-1) < 0 {
					return
				}
				t := time.Now()
				err := do(ctx)
				if ctx.Err() != nil && cfg.Count <= 0 {
					return // cut off by the end of the run: not a result
				}
				rec.add(w, time.Since(t), err)
			}
		})
	}
	wg.Wait()
}

func openLoop(ctx context.Context, cfg Config, do func(context.Context) error, rec *recorder) {
	interval := time.Duration(float64(time.Second) / cfg.Rate)
	slots := make(chan int, cfg.Concurrency)
	for i := range cfg.Concurrency {
		slots <- i
	}
	var wg sync.WaitGroup
	next := time.Now()
	for n := 0; cfg.Count <= 0 || n < cfg.Count; n++ {
		if d := time.Until(next); d > 0 {
			select {
			case <-ctx.Done():
			case <-time.After(d):
			}
		}
		if ctx.Err() != nil {
			break
		}
		scheduled := next
		next = next.Add(interval)
		select {
		case w := <-slots:
			wg.Go(func() {
				defer func() { slots <- w }()
				err := do(ctx)
				if ctx.Err() != nil && cfg.Count <= 0 {
					return
				}
				rec.add(w, time.Since(scheduled), err)
			})
		default:
			rec.drop()
		}
	}
	wg.Wait()
}

// recorder keeps each worker's latencies apart, so workers never contend.
type recorder struct {
	mu       sync.Mutex
	lat      [][]time.Duration
	errs     int
	dropped  int
	firstErr error
}

func newRecorder(workers int) *recorder {
	return &recorder{lat: make([][]time.Duration, workers)}
}

func (r *recorder) add(w int, d time.Duration, err error) {
	if err != nil {
		r.mu.Lock()
		r.errs++
		if r.firstErr == nil {
			r.firstErr = err
		}
		r.mu.Unlock()
		return
	}
	r.lat[w] = append(r.lat[w], d) // only worker w appends here
}

func (r *recorder) drop() {
	r.mu.Lock()
	r.dropped++
	r.mu.Unlock()
}

func (r *recorder) result(cfg Config, elapsed time.Duration) *Result {
	var all []time.Duration
	for _, l := range r.lat {
		all = append(all, l...)
	}
	slices.Sort(all)
	res := &Result{
		Target: cfg.Target, Concurrency: cfg.Concurrency, Rate: cfg.Rate,
		Requests: len(all) + r.errs, Errors: r.errs, Dropped: r.dropped,
		Elapsed: elapsed, latencies: all,
	}
	if r.firstErr != nil {
		res.FirstError = r.firstErr.Error()
	}
	if elapsed > 0 {
		res.Throughput = float64(len(all)) / elapsed.Seconds()
	}
	if len(all) > 0 {
		res.P50, res.P95, res.P99 = Percentile(all, 50), Percentile(all, 95), Percentile(all, 99)
		res.Max = all[len(all)-1]
		var sum time.Duration
		for _, d := range all {
			sum += d
		}
		res.Mean = sum / time.Duration(len(all))
	}
	return res
}

// Percentile returns the p-th percentile (nearest rank) of sorted.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(float64(len(sorted))*p/100+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// requester returns the function that makes one request of cfg's target.
func requester(cfg Config) (func(context.Context) error, error) {
	switch cfg.Target {
	case Model:
		body := []byte(cfg.Inputs)
		return func(ctx context.Context) error {
			_, err := post(ctx, cfg.Client, cfg.URL, body)
			return err
		}, nil
	case Start:
		body, err := json.Marshal(map[string]any{"apiKey": cfg.APIKey, "modelKey": cfg.ModelKey, "modelInputs": cfg.Inputs})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			a, err := postInference(ctx, cfg.Client, cfg.URL+"/start/v4", body)
			if err == nil && !a.Finished {
				err = fmt.Errorf("start: not finished within the wait (%s)", a.Message)
			}
			return err
		}, nil
	case StartOnly:
		body, err := json.Marshal(map[string]any{"apiKey": cfg.APIKey, "modelKey": cfg.ModelKey, "modelInputs": cfg.Inputs, "startOnly": true})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			a, err := postInference(ctx, cfg.Client, cfg.URL+"/start/v4", body)
			if err != nil {
				return err
			}
			return longPoll(ctx, cfg.Client, cfg.URL, cfg.APIKey, a)
		}, nil
	case OpenAI:
		body, err := json.Marshal(map[string]any{"model": cfg.ModelKey, "messages": []map[string]string{{"role": "user", "content": "hi"}}})
		if err != nil {
			return nil, err
		}
		return func(ctx context.Context) error {
			_, err := postAs(ctx, cfg.Client, cfg.URL+"/v1/chat/completions", body, "Bearer "+cfg.APIKey)
			return err
		}, nil
	}
	return nil, fmt.Errorf("loadgen: unknown target %q (model, start, startonly or openai)", cfg.Target)
}

// longPoll checks a started call with longPoll until it has finished.
func longPoll(ctx context.Context, c *http.Client, base, apiKey string, a Answer) error {
	check, err := json.Marshal(map[string]any{"apiKey": apiKey, "callID": a.CallID, "longPoll": true})
	if err != nil {
		return err
	}
	for !a.Finished {
		if a, err = postInference(ctx, c, base+"/check/v4", check); err != nil {
			return err
		}
	}
	return nil
}

// Answer is the part of a start or check answer the load generator reads.
type Answer struct {
	Message  string `json:"message"`
	CallID   string `json:"callID"`
	Finished bool   `json:"finished"`
	BootMs   *int64 `json:"bootMs"`
}

// postInference posts a start or check body and decodes the answer; an
// answer whose message is an error is an error.
func postInference(ctx context.Context, c *http.Client, url string, body []byte) (Answer, error) {
	var a Answer
	b, err := post(ctx, c, url, body)
	if err != nil {
		return a, err
	}
	if err := json.Unmarshal(b, &a); err != nil {
		return a, fmt.Errorf("decode answer: %w", err)
	}
	if a.Finished && a.Message != "success" {
		return a, fmt.Errorf("call failed: %s", a.Message)
	}
	if a.CallID == "" {
		return a, fmt.Errorf("no callID: %s", a.Message)
	}
	return a, nil
}

// Post sends one JSON body and returns the 2xx reply's body.
func Post(ctx context.Context, c *http.Client, url string, body []byte) ([]byte, error) {
	return post(ctx, c, url, body)
}

// PostInference is postInference for other benchmark code.
func PostInference(ctx context.Context, c *http.Client, url string, body []byte) (Answer, error) {
	return postInference(ctx, c, url, body)
}

func post(ctx context.Context, c *http.Client, url string, body []byte) ([]byte, error) {
	return postAs(ctx, c, url, body, "")
}

// postAs is post with an Authorization header (none when auth is "").
func postAs(ctx context.Context, c *http.Client, url string, body []byte, auth string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := c.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, fmt.Errorf("HTTP %d: %.200s", resp.StatusCode, b)
	}
	return b, nil
}
