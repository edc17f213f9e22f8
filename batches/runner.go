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

// maxWindow bounds the calls of a project's batches queued or running at
// once (lanes.go).
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
	m.sweepLoop(ctx) // retention.go; returns when ctx ends
	m.mu.Lock()
	m.start = nil
	m.mu.Unlock()
	wg.Wait()
	return nil
}

// doneLine reports a line's call finished.
type doneLine struct {
	callID string
	end    lineEnd
}

// lineKey is the idempotency key of line idx (0-based) of batch id: its
// call is found by it again, after a restart and when the batch writes
// its results, so the runner holds no state per line (a batch has up to
// 50,000 lines, and a team hundreds of batches).
func lineKey(id string, idx int) string { return fmt.Sprintf("%s:%d", id, idx) }

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
	case store.FailureOf(c).Kind == store.FailCancelled, store.FailureOf(c).Kind == store.FailExpired:
		// A cancel, or the batch's window (its calls' queueTimeout).
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
	lim := m.limit(p.MaxReplicas, p.Model.Concurrency)
	var (
		lines int // read so far
		// failed are the lines that failed with no call made, and why;
		// pending the calls made that have not ended.
		failed  = map[int]string{}
		pending = map[string]bool{}
		done    = make(chan doneLine, lim.calls)
		waits   sync.WaitGroup
		stopped bool
		expired bool
	)
	defer waits.Wait()
	// The completion window: at its end the batch makes no more calls,
	// cancels those not yet ended, however they stand, and ends expired.
	deadline := make(chan struct{})
	if left := time.Unix(b.ExpiresAt, 0).Sub(m.now()); left > 0 {
		t := m.cfg.Clock.AfterFunc(left, func() { close(deadline) })
		defer t.Stop()
	} else {
		close(deadline)
	}
	settle := func(d doneLine) {
		delete(pending, d.callID)
		m.count(id, d.end)
	}
	fail := func(idx int, why string) {
		failed[idx] = why
		m.count(id, lineFailed)
	}
	// follow waits for a line's call c to end; lane is the bytes of the
	// project's lane it holds, given back then (-1: none, a call found
	// again after a restart of a batch that makes no more).
	follow := func(c store.Call, lane int64) {
		pending[c.ID] = true
		waits.Add(1)
		go func() {
			defer waits.Done()
			if lane >= 0 {
				defer m.lanes.give(p.ID, lane)
			}
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
			select { // a runner that has returned (ctx ended) reads no more
			case done <- doneLine{callID: c.ID, end: end}:
			case <-ctx.Done():
			}
		}()
	}
	// waitLane takes a lane of the project for a call of size bytes,
	// waiting for one (as the batch's own calls end, or another batch's)
	// until the batch is cancelled or expires (false) or ctx ends.
	waitLane := func(size int64) (bool, error) {
		for {
			ok, freed := m.lanes.take(p.ID, lim, size)
			if ok {
				return true, nil
			}
			select {
			case d := <-done:
				settle(d)
			case <-freed:
			case <-stop:
				stopped = true
				return false, nil
			case <-deadline:
				expired = true
				return false, nil
			case <-ctx.Done():
				return false, ctx.Err()
			}
		}
	}
	err = m.eachLine(b.InputFileID, func(_ int, l line, bad *InputError) error {
		idx := lines
		lines++
		switch {
		case bad != nil: // checked at creation: maxBodyBytes was lowered since
			fail(idx, bad.Msg)
			return nil
		case projectGone:
			fail(idx, "project "+b.Project+" was deleted")
			return nil
		case !stopped && isClosed(deadline):
			expired = true
		}
		stopped = stopped || isClosed(stop)
		if !stopped && !expired {
			inputs, err := lineInputs(p, b.Endpoint, l.Body)
			if err != nil {
				fail(idx, err.Error())
				return nil
			}
			size := int64(len(inputs))
			took, err := waitLane(size)
			if err != nil {
				return err
			}
			if took {
				c, err := m.submit(ctx, stop, deadline, p, b, inputs, lineKey(id, idx))
				if err == nil {
					follow(c, size)
					return nil
				}
				m.lanes.give(p.ID, size)
				switch {
				case ctx.Err() != nil:
					return ctx.Err()
				case errors.Is(err, errCancelled):
					stopped = true
				case errors.Is(err, errExpired):
					expired = true
				default:
					fail(idx, err.Error())
					return nil
				}
			}
		}
		if stopped || expired {
			// A call made before a restart may run: follow it to its
			// end (cancelled below with the others still pending).
			if c, err := m.cfg.Store.CallByIdempotencyKey(b.Team, lineKey(id, idx)); err == nil {
				follow(c, -1)
			}
		}
		return nil
	})
	if err != nil {
		if ctx.Err() == nil {
			log.Error().Err(err).Msg("batch: reading its input file failed; it resumes at the next start")
		}
		return
	}
	// A cancel, or the window's end, ends the calls still pending, once;
	// a finished one answers ErrFinished.
	cancelled := false
	cancelAll := func() {
		cancelled = true
		for callID := range pending {
			_, _ = m.cfg.Sched.Cancel(callID)
		}
	}
	stopped = stopped || isClosed(stop)
	if stopped || expired {
		cancelAll()
	}
	for len(pending) > 0 {
		stopNow, deadlineNow := stop, deadline
		if cancelled {
			stopNow, deadlineNow = nil, nil
		}
		select {
		case d := <-done:
			settle(d)
		case <-stopNow:
			stopped = true
			cancelAll()
		case <-deadlineNow:
			expired = true
			cancelAll()
		case <-ctx.Done():
			return
		}
	}
	if err := m.finish(b, failed, stopped, expired && !stopped); err != nil && ctx.Err() == nil {
		log.Error().Err(err).Msg("batch: writing its results failed; it resumes at the next start")
	}
}

// lineInputs is a line's body as its call's inputs: the served model's
// name in it.
func lineInputs(p store.Project, endpoint string, body json.RawMessage) (json.RawMessage, error) {
	req, err := openai.ParseRequest(endpoint, body)
	if err != nil {
		return nil, err
	}
	return req.Body(p.ServedModelName())
}

var (
	errCancelled = errors.New("batch cancelled")
	errExpired   = errors.New("batch expired")
)

// submit starts a line's call: its body with the served model, to the
// batch's endpoint, under the line's idempotency key (so that after a
// restart the line finds its call again), with what is left of the
// batch's window as its queueTimeout, so that the scheduler ends it at
// the batch's deadline if it is still queued then, whatever becomes of the
// runner. A full queue or team quota is waited out; other refusals fail
// the line.
func (m *Manager) submit(ctx context.Context, stop, deadline <-chan struct{}, p store.Project, b batchRecord, inputs json.RawMessage, key string) (store.Call, error) {
	for {
		left := time.Unix(b.ExpiresAt, 0).Sub(m.now())
		if left <= 0 {
			return store.Call{}, errExpired
		}
		c, err := m.cfg.Sched.Start(ctx, p, scheduler.Request{Inputs: inputs, Route: b.Endpoint, IdempotencyKey: key,
			QueueTimeout: int((left + time.Second - 1) / time.Second)})
		if err == nil || !retryable(err) {
			return c, err
		}
		t := time.NewTimer(m.cfg.Retry)
		select {
		case <-t.C:
		case <-deadline:
			t.Stop()
			return store.Call{}, errExpired
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
// error file (the others), in line order, then records it final. It reads
// the input file through again for the lines' custom_ids, and finds each
// line's call by its key; failed are the lines that failed with no call.
func (m *Manager) finish(b batchRecord, failed map[int]string, cancelled, expired bool) error {
	if err := m.setStatus(b.ID, func(r *batchRecord, now int64) {
		if r.Status == StatusInProgress {
			r.Status, r.FinalizingAt = StatusFinalizing, &now
		}
	}); err != nil {
		return err
	}
	var lines, ok, nfailed, unkept int
	m.mu.Lock()
	// A finish run again after a restart writes these files anew: what a
	// previous run recorded of them is not the team's twice.
	delete(m.files, b.OutID)
	delete(m.files, b.ErrID)
	m.mu.Unlock()
	// Both files count in the team's bytes as they are written, each line
	// reserved before it is: a line whose result does not fit fails with
	// a short error line instead, and one whose error line does not fit
	// either is counted in the batch's errors.
	out := &upload{m: m, team: b.Team, max: m.cfg.MaxTeamBytes}
	errw := &upload{m: m, team: b.Team, max: m.cfg.MaxTeamBytes}
	release := func() { out.release(); errw.release() } // m.mu held
	put := func(u *upload, l outputLine) (bool, error) {
		enc, err := json.Marshal(l)
		if err != nil {
			return false, err
		}
		enc = append(enc, '\n')
		var be *BudgetError
		if err := u.room(len(enc)); errors.As(err, &be) || errors.Is(err, ErrTooLarge) {
			return false, nil
		}
		_, err = u.Write(enc)
		return err == nil, err
	}
	err := durable.Replace(m.contentPath(b.OutID), func(ow io.Writer) error {
		out.w = ow
		return durable.Replace(m.contentPath(b.ErrID), func(ew io.Writer) error {
			errw.w = ew
			return m.eachLine(b.InputFileID, func(_ int, l line, _ *InputError) error {
				idx := lines
				lines++
				ol, end := m.resultLine(b, idx, l.CustomID, failed[idx], cancelled, expired)
				if end == lineCompleted {
					kept, err := put(out, ol)
					if err != nil {
						return err
					}
					if kept {
						ok++
						return nil
					}
					callID := ol.Response.RequestID
					end = lineFailed
					ol.Response, ol.Error = nil, &LineError{Code: "file_budget", Message: fmt.Sprintf(
						"the result of call %s was not written: it would take your team's files past their bytes (openai.maxTeamFileBytes); GET /v1/calls/%s/response answers it until the call's record expires",
						callID, callID)}
				}
				if end == lineFailed {
					nfailed++
				}
				kept, err := put(errw, ol)
				if err != nil {
					return err
				}
				if !kept {
					unkept++
				}
				return nil
			})
		})
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	// The files' bytes count as the team's once saved: the reservations
	// go in the same hold of the lock.
	defer release()
	if err != nil {
		return err
	}
	now := m.now().Unix()
	r := m.batches[b.ID]
	next := *r
	next.RequestCounts = RequestCounts{Total: lines, Completed: ok, Failed: nfailed}
	if unkept > 0 {
		next.Errors = &ErrorList{Object: "list", Data: append(errorsOf(next.Errors), LineError{Code: "file_budget", Message: fmt.Sprintf(
			"%d lines' errors were not written to the error file: your team's files are at their bytes (openai.maxTeamFileBytes); delete files with DELETE /v1/files/ID", unkept)})}
	}
	for _, f := range []struct {
		id, suffix string
		n          int64
		into       **string
	}{{b.OutID, "output", out.n, &next.OutputFileID}, {b.ErrID, "errors", errw.n, &next.ErrorFileID}} {
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
func (m *Manager) resultLine(b batchRecord, i int, customID, failed string, cancelled, expired bool) (outputLine, lineEnd) {
	ol := outputLine{ID: fmt.Sprintf("batch_req_%s_%d", strings.TrimPrefix(b.ID, "batch_"), i), CustomID: customID}
	lineErr := func(end lineEnd, code, msg string) (outputLine, lineEnd) {
		ol.Error = &LineError{Code: code, Message: msg}
		return ol, end
	}
	if failed != "" {
		return lineErr(lineFailed, "request_failed", failed)
	}
	c, err := m.cfg.Store.CallByIdempotencyKey(b.Team, lineKey(b.ID, i))
	if err == nil {
		c, _, err = m.cfg.Sched.Lookup(c.ID) // with its outputs
	}
	switch {
	case errors.Is(err, store.ErrNotFound) && cancelled:
		return lineErr(lineNotRun, "batch_cancelled", "this request was not run: the batch was cancelled")
	case errors.Is(err, store.ErrNotFound) && expired:
		return lineErr(lineNotRun, expiredCode, expiredMsg)
	case errors.Is(err, store.ErrNotFound):
		return lineErr(lineFailed, "request_failed", "this request was not run, or its call's record has expired (resultTTL)")
	case err != nil:
		// The error's text is the store's, for the log: the file says
		// what happened and where to look.
		m.cfg.Log.Error().Err(err).Str("batch", b.ID).Int("line", i).Msg("reading a batch line's result failed")
		return lineErr(lineFailed, "result_unavailable", fmt.Sprintf("the result of line %d could not be read; see the server log", i+1))
	}
	if end := endOf(c); expired && end == lineNotRun {
		// Ended by the window, queued or running, as OpenAI ends them.
		return lineErr(end, expiredCode, expiredMsg)
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

// What a line the batch's window ended says, as OpenAI's.
const (
	expiredCode = "batch_expired"
	expiredMsg  = "this request could not be run before the batch's completion window expired"
)

// setStatus changes batch id's record with fn and writes it.
func (m *Manager) setStatus(id string, fn func(r *batchRecord, now int64)) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	next := *m.batches[id]
	fn(&next, m.now().Unix())
	return m.saveBatch(&next)
}

// errorsOf is the errors of a list, none for none.
func errorsOf(l *ErrorList) []LineError {
	if l == nil {
		return nil
	}
	return l.Data
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
