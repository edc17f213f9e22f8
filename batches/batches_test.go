package batches

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"inferd/scheduler"
	"inferd/store"
)

// fakeSched runs calls in memory: each call waits until the test answers
// it (answer), or succeeds at once when auto is set. Calls are found again
// by their idempotency key, as the scheduler's are, and outlive a Manager.
type fakeSched struct {
	mu     sync.Mutex
	calls  map[string]*fakeCall
	byKey  map[string]string
	starts int
	auto   bool
	// refuse, while > 0, refuses that many starts with a full queue.
	refuse int
}

type fakeCall struct {
	c    store.Call
	done chan struct{}
}

func newFakeSched() *fakeSched {
	return &fakeSched{calls: map[string]*fakeCall{}, byKey: map[string]string{}}
}

func (f *fakeSched) Start(_ context.Context, p store.Project, req scheduler.Request) (store.Call, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.refuse > 0 {
		f.refuse--
		return store.Call{}, fmt.Errorf("%w (3 calls waiting)", scheduler.ErrQueueFull)
	}
	if id, ok := f.byKey[p.TeamID+"\x00"+req.IdempotencyKey]; ok {
		return f.calls[id].c, nil
	}
	f.starts++
	c := store.Call{ID: fmt.Sprintf("call_%d", f.starts), ProjectID: p.ID, TeamID: p.TeamID, State: store.CallQueued,
		Inputs: req.Inputs, Route: req.Route, IdempotencyKey: req.IdempotencyKey}
	fc := &fakeCall{c: c, done: make(chan struct{})}
	f.calls[c.ID] = fc
	f.byKey[p.TeamID+"\x00"+req.IdempotencyKey] = c.ID
	if f.auto {
		f.end(fc, true)
	}
	return c, nil
}

// end finishes a call: it echoes its inputs' "n", or fails with a model
// error; f.mu is held.
func (f *fakeSched) end(fc *fakeCall, ok bool) {
	var in struct {
		Model string `json:"model"`
		N     int    `json:"n"`
	}
	_ = json.Unmarshal(fc.c.Inputs, &in)
	if ok {
		fc.c.State, fc.c.Message = store.CallSucceeded, "success"
		fc.c.Outputs = json.RawMessage(fmt.Sprintf(`{"n":%d,"model":%q}`, in.N, in.Model))
	} else {
		body := `{"error":{"message":"bad n","type":"invalid_request_error"}}`
		fc.c.State, fc.c.Message = store.CallFailed, "error: model returned HTTP 400: "+body
		fc.c.Failure = &store.Failure{Kind: store.FailModelStatus, Status: 400, Body: body}
	}
	close(fc.done)
}

func (f *fakeSched) answerAll(ok func(n int) bool) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := 0
	for _, fc := range f.calls {
		if !fc.c.State.Done() {
			var in struct{ N int }
			_ = json.Unmarshal(fc.c.Inputs, &in)
			f.end(fc, ok(in.N))
			k++
		}
	}
	return k
}

func (f *fakeSched) made() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.starts
}

func (f *fakeSched) pending() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	k := 0
	for _, fc := range f.calls {
		if !fc.c.State.Done() {
			k++
		}
	}
	return k
}

func (f *fakeSched) Lookup(id string) (store.Call, <-chan struct{}, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc, ok := f.calls[id]
	if !ok {
		return store.Call{}, nil, store.ErrNotFound
	}
	return fc.c, fc.done, nil
}

func (f *fakeSched) Cancel(id string) (store.Call, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fc := f.calls[id]
	if fc.c.State.Done() {
		return fc.c, scheduler.ErrFinished
	}
	fc.c.State, fc.c.Message = store.CallFailed, "error: cancelled by request"
	fc.c.Failure = &store.Failure{Kind: store.FailCancelled}
	close(fc.done)
	return fc.c, nil
}

// fakeStore knows one project and the fake scheduler's keys.
type fakeStore struct {
	p     store.Project
	sched *fakeSched
}

func (s fakeStore) GetProject(id string) (store.Project, error) {
	if id != s.p.ID {
		return store.Project{}, store.ErrNotFound
	}
	return s.p, nil
}

func (s fakeStore) CallByIdempotencyKey(team, key string) (store.Call, error) {
	s.sched.mu.Lock()
	defer s.sched.mu.Unlock()
	id, ok := s.sched.byKey[team+"\x00"+key]
	if !ok {
		return store.Call{}, store.ErrNotFound
	}
	return s.sched.calls[id].c, nil
}

func llm() store.Project {
	p := store.NewProject("llm", "acme")
	p.Model.Protocol = store.ProtocolOpenAI
	p.Model.ServedModel = "served-llm"
	p.MaxReplicas = 2 // a window of 4 calls
	return p
}

func resolve(model string) (store.Project, bool) { return llm(), model == "llm" }

type runningManager struct {
	*Manager
	stop func()
}

func startManager(t *testing.T, dir string, sched *fakeSched) runningManager {
	t.Helper()
	m, err := New(Config{Dir: dir, Sched: sched, Store: fakeStore{llm(), sched}, Log: zerolog.Nop(), Retry: time.Millisecond, MaxFileBytes: 1 << 20, MaxTeamBytes: 3 << 20})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	go func() {
		defer close(ended)
		_ = m.Run(ctx)
	}()
	rm := runningManager{m, func() { cancel(); <-ended }}
	t.Cleanup(rm.stop)
	return rm
}

func jsonl(n int, line func(i int) string) string {
	var b strings.Builder
	for i := range n {
		b.WriteString(line(i) + "\n")
	}
	return b.String()
}

func chatLine(i int) string {
	return fmt.Sprintf(`{"custom_id":"req-%d","method":"POST","url":"/v1/chat/completions","body":{"model":"llm","n":%d,"messages":[]}}`, i, i)
}

func waitStatus(t *testing.T, m *Manager, team, id string, want string) Batch {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		b, err := m.Batch(Team(team), id)
		if err != nil {
			t.Fatal(err)
		}
		if b.Status == want {
			return b
		}
		if time.Now().After(deadline) {
			t.Fatalf("batch %s is %s, want %s", id, b.Status, want)
		}
		time.Sleep(5 * time.Millisecond) // polls the runner's state; no timing is asserted
	}
}

func waitPending(t *testing.T, s *fakeSched, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for s.pending() != n {
		if time.Now().After(deadline) {
			t.Fatalf("%d calls pending, want %d", s.pending(), n)
		}
		time.Sleep(time.Millisecond)
	}
}

func readLines(t *testing.T, m *Manager, team, id string) []outputLine {
	t.Helper()
	f, _, err := m.OpenContent(Team(team), id)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []outputLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l outputLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		out = append(out, l)
	}
	return out
}

// Each line runs as a call of the project with the served model, at most
// the window at once; successes go to the output file and failures (the
// model's error with its status) to the error file, in line order.
func TestBatchRunsEachLineAndWritesItsResults(t *testing.T) {
	sched := newFakeSched()
	m := startManager(t, t.TempDir(), sched)
	f, err := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(10, chatLine)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	if b.Status != StatusInProgress || b.RequestCounts.Total != 10 || b.Model != "llm" {
		t.Fatalf("created %+v", b)
	}
	waitPending(t, sched, 4) // the window: 2 replicas x concurrency 1 x 2
	for sched.made() < 10 {
		sched.answerAll(func(n int) bool { return n != 3 })
	}
	sched.answerAll(func(n int) bool { return n != 3 })
	b = waitStatus(t, m.Manager, "acme", b.ID, StatusCompleted)
	if b.RequestCounts != (RequestCounts{Total: 10, Completed: 9, Failed: 1}) || b.OutputFileID == nil || b.ErrorFileID == nil {
		t.Fatalf("completed %+v", b)
	}
	out := readLines(t, m.Manager, "acme", *b.OutputFileID)
	if len(out) != 9 || out[0].CustomID != "req-0" || out[8].CustomID != "req-9" {
		t.Fatalf("output lines %+v", out)
	}
	if r := out[1].Response; r == nil || r.StatusCode != 200 || string(r.Body) != `{"n":1,"model":"served-llm"}` || !strings.HasPrefix(r.RequestID, "call_") {
		t.Errorf("line req-1: %+v", out[1].Response)
	}
	errs := readLines(t, m.Manager, "acme", *b.ErrorFileID)
	if len(errs) != 1 || errs[0].CustomID != "req-3" || errs[0].Response.StatusCode != 400 || !strings.Contains(string(errs[0].Response.Body), "bad n") {
		t.Errorf("error lines %+v", errs)
	}
	// Another team sees none of it.
	if _, err := m.Batch(Team("other"), b.ID); !errors.Is(err, ErrNotFound) {
		t.Errorf("another team's batch: %v", err)
	}
	for _, id := range []string{f.ID, *b.OutputFileID} {
		if _, _, err := m.OpenContent(Team("other"), id); !errors.Is(err, ErrNotFound) {
			t.Errorf("another team's file %s: %v", id, err)
		}
	}
}

// A batch cut by a restart resumes where it was: the lines whose calls
// were made find them again by their keys, so no line runs twice.
func TestBatchResumesAfterARestartWithoutRunningALineTwice(t *testing.T) {
	dir := t.TempDir()
	sched := newFakeSched()
	first := startManager(t, dir, sched)
	f, err := first.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(20, chatLine)))
	if err != nil {
		t.Fatal(err)
	}
	b, err := first.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	waitPending(t, sched, 4)
	sched.answerAll(func(int) bool { return true }) // 4 done
	waitPending(t, sched, 4)                        // 4 more started
	first.stop()                                    // the daemon stops with 4 calls queued

	second := startManager(t, dir, sched)
	sched.mu.Lock()
	sched.auto = true
	sched.mu.Unlock()
	sched.answerAll(func(int) bool { return true })
	b = waitStatus(t, second.Manager, "acme", b.ID, StatusCompleted)
	if b.RequestCounts.Completed != 20 || sched.made() != 20 {
		t.Errorf("counts %+v after %d calls made, want 20 of 20", b.RequestCounts, sched.made())
	}
	if out := readLines(t, second.Manager, "acme", *b.OutputFileID); len(out) != 20 {
		t.Errorf("%d output lines", len(out))
	}
}

// A cancelled batch cancels its pending calls and ends cancelled; lines
// never run are in the error file.
func TestCancelledBatch(t *testing.T) {
	sched := newFakeSched()
	m := startManager(t, t.TempDir(), sched)
	f, _ := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(10, chatLine)))
	b, err := m.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	waitPending(t, sched, 4)
	if b, err = m.CancelBatch(Team("acme"), b.ID); err != nil || b.Status != StatusCancelling {
		t.Fatalf("cancel: %+v %v", b, err)
	}
	b = waitStatus(t, m.Manager, "acme", b.ID, StatusCancelled)
	errs := readLines(t, m.Manager, "acme", *b.ErrorFileID)
	if len(errs) != 10 || b.OutputFileID != nil {
		t.Fatalf("%d error lines, output %v", len(errs), b.OutputFileID)
	}
	if errs[0].Response == nil || errs[0].Response.StatusCode != 400 || errs[9].Error == nil || errs[9].Error.Code != "batch_cancelled" {
		t.Errorf("first %+v, last %+v", errs[0].Response, errs[9].Error)
	}
	// The lines a cancel kept from running, and those whose calls it
	// ended, are neither completed nor failed.
	if b.RequestCounts != (RequestCounts{Total: 10}) {
		t.Errorf("counts %+v, want 10 lines none of them failed", b.RequestCounts)
	}
	if sched.pending() != 0 || sched.made() != 4 {
		t.Errorf("%d pending of %d made", sched.pending(), sched.made())
	}
}

// A full queue is waited out: the line is offered again.
func TestBatchWaitsOutAFullQueue(t *testing.T) {
	sched := newFakeSched()
	sched.auto, sched.refuse = true, 3
	m := startManager(t, t.TempDir(), sched)
	f, _ := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(jsonl(2, chatLine)))
	b, err := m.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
	if err != nil {
		t.Fatal(err)
	}
	if b = waitStatus(t, m.Manager, "acme", b.ID, StatusCompleted); b.RequestCounts.Completed != 2 {
		t.Errorf("counts %+v", b.RequestCounts)
	}
}

// A bad input file is refused whole, naming its line; nothing is started.
func TestCreateBatchChecksTheInputFile(t *testing.T) {
	sched := newFakeSched()
	m := startManager(t, t.TempDir(), sched)
	for _, tc := range []struct{ file, param string }{
		{"not json\n", "input_file_id"},
		{chatLine(0) + "\n" + chatLine(0), "custom_id"},
		{strings.Replace(chatLine(0), "/v1/chat/completions", "/v1/embeddings", 1), "url"},
		{strings.Replace(chatLine(0), `"POST"`, `"GET"`, 1), "method"},
		{chatLine(0) + "\n" + strings.Replace(chatLine(1), `"model":"llm"`, `"model":"other"`, 1), "body.model"},
		{strings.Replace(chatLine(0), `"n":0`, `"stream":true`, 1), "body.stream"},
		{strings.Replace(chatLine(0), `"model":"llm"`, `"model":"secret"`, 1), "model"},
		{"\n\n", "input_file_id"},
	} {
		f, err := m.PutFile(Team("acme"), "in.jsonl", PurposeBatch, strings.NewReader(tc.file))
		if err != nil {
			t.Fatal(err)
		}
		_, err = m.CreateBatch(Team("acme"), CreateRequest{InputFileID: f.ID, Endpoint: "/v1/chat/completions", CompletionWindow: "24h"}, resolve)
		var ie *InputError
		if !errors.As(err, &ie) || ie.Param != tc.param {
			t.Errorf("%q: got %v, want an error on %s", tc.file, err, tc.param)
		}
	}
	if sched.made() != 0 {
		t.Errorf("%d calls started", sched.made())
	}
}

// Files are bounded one by one and per team; a refused upload leaves
// nothing behind.
func TestFileBudgets(t *testing.T) {
	dir := t.TempDir()
	m := startManager(t, dir, newFakeSched())
	if _, err := m.PutFile(Team("acme"), "big", PurposeBatch, strings.NewReader(strings.Repeat("x", 1<<20+1))); !errors.Is(err, ErrTooLarge) {
		t.Errorf("over MaxFileBytes: %v", err)
	}
	for i := range 3 {
		if _, err := m.PutFile(Team("acme"), "f", PurposeBatch, strings.NewReader(strings.Repeat("x", 1<<20))); err != nil {
			t.Fatalf("file %d: %v", i, err)
		}
	}
	var be *BudgetError
	if _, err := m.PutFile(Team("acme"), "f", PurposeBatch, strings.NewReader("x")); !errors.As(err, &be) {
		t.Errorf("over the team's bytes: %v", err)
	}
	if _, err := m.PutFile(Team("other"), "f", PurposeBatch, strings.NewReader("x")); err != nil {
		t.Errorf("another team's upload: %v", err)
	}
	if _, err := m.PutFile(Team("acme"), "f", "fine-tune", strings.NewReader("x")); err == nil {
		t.Error("a purpose other than batch was taken")
	}
	entries, _ := os.ReadDir(dir + "/files")
	if len(entries) != 8 { // 4 files, each content and metadata
		t.Errorf("%d entries in files/, want 8", len(entries))
	}
	_ = io.Discard
}
