package batches

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	"inferd/internal/durable"
	"inferd/openai"
	"inferd/scheduler"
	"inferd/store"
)

// maxWindow bounds the calls of one batch queued or running at once.
const maxWindow = 256

// Run resumes the batches a previous daemon left unfinished, runs those
// created later, and returns once ctx has ended and every batch goroutine
// with it. A batch cut by the end is resumed by the next Run.
func (m *Manager) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	m.mu.Lock()
	m.start = func(id string) { // m.mu held
		stop := make(chan struct{})
		if m.batches[id].Status == StatusCancelling {
			close(stop)
		} else {
			m.runs[id] = stop
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			m.run(ctx, id, stop)
		}()
	}
	for _, id := range sortedIDs(m.batches) {
		if !m.batches[id].final() {
			m.start(id)
		}
	}
	m.mu.Unlock()
	<-ctx.Done()
	m.mu.Lock()
	m.start = nil
	m.mu.Unlock()
	wg.Wait()
	return nil
}

// lineState is what became of one line of a running batch.
type lineState struct {
	customID string
	callID   string // "" = no call made
	failed   string // why no call could be made
}

// doneLine reports a line's call finished.
type doneLine struct {
	idx int
	end lineEnd
}

// lineEnd is how a line ended, for the batch's request_counts: a line
// never run, or whose call a cancel ended before it could, is neither
// completed nor failed.
type lineEnd int

const (
	lineFailed lineEnd = iota
	lineCompleted
	lineNotRun
)

// endOf is how a line whose call is c ended.
func endOf(c store.Call) lineEnd {
	switch {
	case c.State == store.CallSucceeded:
		return lineCompleted
	case store.FailureOf(c).Kind == store.FailCancelled:
		return lineNotRun
	}
	return lineFailed
}

// run runs batch id: each line a call (at most window of them queued or
// running at once), then the output files. stop closes when the batch is
// cancelled. An end of ctx leaves the batch as it stands for the next Run.
func (m *Manager) run(ctx context.Context, id string, stop <-chan struct{}) {
	m.mu.Lock()
	b := *m.batches[id]
	m.batches[id].RequestCounts.Completed, m.batches[id].RequestCounts.Failed = 0, 0
	m.mu.Unlock()
	log := m.cfg.Log.With().Str("batch", id).Logger()

	p, err := m.cfg.Store.GetProject(b.Project)
	projectGone := errors.Is(err, store.ErrNotFound)
	if err != nil && !projectGone {
		log.Error().Err(err).Msg("batch: reading its project failed; it resumes at the next start")
		return
	}
	window := min(max(p.MaxReplicas*p.Model.Concurrency*2, 1), maxWindow)
	var (
		lines    []lineState
		inflight int
		done     = make(chan doneLine, window)
		waits    sync.WaitGroup
		stopped  bool
		expired  bool
	)
	defer waits.Wait()
	settle := func(d doneLine) {
		inflight--
		m.count(id, d.end)
	}
	key := func(idx int) string { return fmt.Sprintf("%s:%d", id, idx) }
	follow := func(idx int, c store.Call) {
		lines[idx].callID = c.ID
		inflight++
		waits.Add(1)
		go func() {
			defer waits.Done()
			_, ch, err := m.cfg.Sched.Lookup(c.ID)
			if err == nil {
				select {
				case <-ch:
				case <-ctx.Done():
					return
				}
			}
			end := lineFailed
			if fc, _, err := m.cfg.Sched.Lookup(c.ID); err == nil {
				end = endOf(fc)
			}
			done <- doneLine{idx: idx, end: end}
		}()
	}
	err = m.eachLine(b.InputFileID, func(_ int, l line) error {
		idx := len(lines)
		lines = append(lines, lineState{customID: l.CustomID})
		switch {
		case projectGone:
			lines[idx].failed = "project " + b.Project + " was deleted"
			m.count(id, lineFailed)
			return nil
		case !stopped && m.now().Unix() >= b.ExpiresAt:
			expired = true
		}
		for !stopped && !expired && inflight >= window {
			select {
			case d := <-done:
				settle(d)
			case <-stop:
				stopped = true
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if isClosed(stop) {
			stopped = true
		}
		if stopped || expired {
			// A call made before a restart may run: follow it to its
			// end (cancelled, for a cancelled batch).
			c, err := m.cfg.Store.CallByIdempotencyKey(b.Team, key(idx))
			if err == nil {
				if stopped && !c.State.Done() {
					_, _ = m.cfg.Sched.Cancel(c.ID)
				}
				follow(idx, c)
			}
			return nil
		}
		c, err := m.submit(ctx, stop, p, b.Endpoint, l.Body, key(idx))
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, errCancelled):
			stopped = true
		case err != nil:
			lines[idx].failed = err.Error()
			m.count(id, lineFailed)
		default:
			follow(idx, c)
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			log.Error().Err(err).Msg("batch: reading its input file failed; it resumes at the next start")
		}
		return
	}
	// Cancelling ends the calls still pending, once; a finished one
	// answers ErrFinished.
	cancelled := false
	cancelAll := func() {
		stopped, cancelled = true, true
		for _, l := range lines {
			if l.callID != "" {
				_, _ = m.cfg.Sched.Cancel(l.callID)
			}
		}
	}
	if stopped || isClosed(stop) {
		cancelAll()
	}
	for inflight > 0 {
		stopNow := stop
		if cancelled {
			stopNow = nil
		}
		select {
		case d := <-done:
			settle(d)
		case <-stopNow:
			cancelAll()
		case <-ctx.Done():
			return
		}
	}
	if err := m.finish(b, lines, stopped || isClosed(stop), expired); err != nil && ctx.Err() == nil {
		log.Error().Err(err).Msg("batch: writing its results failed; it resumes at the next start")
	}
}

var errCancelled = errors.New("batch cancelled")

// submit starts a line's call: its body with the served model, to the
// batch's endpoint, under the line's idempotency key (so that after a
// restart the line finds its call again). A full queue or team quota is
// waited out; other refusals fail the line.
func (m *Manager) submit(ctx context.Context, stop <-chan struct{}, p store.Project, endpoint string, body json.RawMessage, key string) (store.Call, error) {
	req, err := openai.ParseRequest(endpoint, body)
	if err != nil {
		return store.Call{}, err
	}
	inputs, err := req.Body(p.ServedModelName())
	if err != nil {
		return store.Call{}, err
	}
	for {
		c, err := m.cfg.Sched.Start(ctx, p, scheduler.Request{Inputs: inputs, Route: endpoint, IdempotencyKey: key})
		if err == nil || !retryable(err) {
			return c, err
		}
		t := time.NewTimer(m.cfg.Retry)
		select {
		case <-t.C:
		case <-stop:
			t.Stop()
			return store.Call{}, errCancelled
		case <-ctx.Done():
			t.Stop()
			return store.Call{}, ctx.Err()
		}
	}
}

// retryable says whether a refused start may succeed later by itself.
func retryable(err error) bool {
	return errors.Is(err, scheduler.ErrQueueFull) || errors.Is(err, scheduler.ErrTeamQuota) ||
		errors.Is(err, scheduler.ErrShuttingDown) || errors.Is(err, store.ErrUnavailable)
}

// count adds a finished line to the batch's counts.
func (m *Manager) count(id string, end lineEnd) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch end {
	case lineCompleted:
		m.batches[id].RequestCounts.Completed++
	case lineFailed:
		m.batches[id].RequestCounts.Failed++
	}
}

// outputLine is a line of an output or error file, as OpenAI's.
type outputLine struct {
	ID       string          `json:"id"`
	CustomID string          `json:"custom_id"`
	Response *outputResponse `json:"response"`
	Error    *LineError      `json:"error"`
}

type outputResponse struct {
	StatusCode int             `json:"status_code"`
	RequestID  string          `json:"request_id"` // the call's id
	Body       json.RawMessage `json:"body"`
}

// finish writes a batch's output file (the lines whose call succeeded) and
// error file (the others), in line order, then records it final.
func (m *Manager) finish(b batchRecord, lines []lineState, cancelled, expired bool) error {
	if err := m.setStatus(b.ID, func(r *batchRecord, now int64) {
		if r.Status == StatusInProgress {
			r.Status, r.FinalizingAt = StatusFinalizing, &now
		}
	}); err != nil {
		return err
	}
	var ok, failed int
	write := func(w io.Writer, l outputLine) error {
		enc, err := json.Marshal(l)
		if err != nil {
			return err
		}
		_, err = w.Write(append(enc, '\n'))
		return err
	}
	var outBytes, errBytes int64
	err := durable.Replace(m.contentPath(b.OutID), func(ow io.Writer) error {
		out := &countingWriter{w: ow}
		defer func() { outBytes = out.n }()
		return durable.Replace(m.contentPath(b.ErrID), func(ew io.Writer) error {
			errw := &countingWriter{w: ew}
			defer func() { errBytes = errw.n }()
			for i, l := range lines {
				ol, end := m.resultLine(b, i, l, cancelled, expired)
				w := io.Writer(errw)
				switch end {
				case lineCompleted:
					w = out
					ok++
				case lineFailed:
					failed++
				}
				if err := write(w, ol); err != nil {
					return err
				}
			}
			return nil
		})
	})
	if err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.now().Unix()
	r := m.batches[b.ID]
	next := *r
	next.RequestCounts = RequestCounts{Total: len(lines), Completed: ok, Failed: failed}
	for _, f := range []struct {
		id, suffix string
		n          int64
		into       **string
	}{{b.OutID, "output", outBytes, &next.OutputFileID}, {b.ErrID, "errors", errBytes, &next.ErrorFileID}} {
		if f.n == 0 {
			m.removeContent(f.id)
			continue
		}
		rec := fileRecord{File: File{ID: f.id, Object: "file", Bytes: f.n, CreatedAt: now,
			Filename: b.ID + "_" + f.suffix + ".jsonl", Purpose: PurposeBatchOutput}, Team: b.Team, Projects: []string{b.Project}}
		if err := m.saveFile(rec); err != nil {
			return err
		}
		id := f.id
		*f.into = &id
	}
	switch {
	case cancelled:
		next.Status, next.CancelledAt = StatusCancelled, &now
	case expired:
		next.Status, next.ExpiredAt = StatusExpired, &now
	default:
		next.Status, next.CompletedAt = StatusCompleted, &now
	}
	return m.saveBatch(&next)
}

// resultLine is the output line of a batch's line i, and how it ended: a
// completed line goes to the output file, the others to the error file,
// and one that never ran (or whose call a cancel ended) counts as neither
// completed nor failed.
func (m *Manager) resultLine(b batchRecord, i int, l lineState, cancelled, expired bool) (outputLine, lineEnd) {
	ol := outputLine{ID: fmt.Sprintf("batch_req_%s_%d", strings.TrimPrefix(b.ID, "batch_"), i), CustomID: l.customID}
	lineErr := func(end lineEnd, code, msg string) (outputLine, lineEnd) {
		ol.Error = &LineError{Code: code, Message: msg}
		return ol, end
	}
	switch {
	case l.failed != "":
		return lineErr(lineFailed, "request_failed", l.failed)
	case l.callID == "" && cancelled:
		return lineErr(lineNotRun, "batch_cancelled", "this request was not run: the batch was cancelled")
	case l.callID == "" && expired:
		return lineErr(lineNotRun, "batch_expired", "this request was not run before the batch expired")
	case l.callID == "":
		return lineErr(lineFailed, "request_failed", "this request was not run")
	}
	c, _, err := m.cfg.Sched.Lookup(l.callID)
	if err != nil {
		// The error's text is the store's, for the log: the file says
		// what happened and where to look.
		m.cfg.Log.Error().Err(err).Str("batch", b.ID).Str("call", l.callID).Msg("reading a batch line's result failed")
		return lineErr(lineFailed, "result_unavailable", fmt.Sprintf("the result of call %s could not be read; see the server log", l.callID))
	}
	ol.Response = &outputResponse{RequestID: c.ID}
	if c.State == store.CallSucceeded {
		ol.Response.StatusCode, ol.Response.Body = 200, c.Outputs
		return ol, lineCompleted
	}
	f := openai.CallFailure(c)
	body, _ := json.Marshal(f.Body)
	ol.Response.StatusCode, ol.Response.Body = f.Status, body
	return ol, endOf(c)
}

// setStatus changes batch id's record with fn and writes it.
func (m *Manager) setStatus(id string, fn func(r *batchRecord, now int64)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := *m.batches[id]
	fn(&next, m.now().Unix())
	return m.saveBatch(&next)
}

type countingWriter struct {
	w io.Writer
	n int64
}

func (c *countingWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
