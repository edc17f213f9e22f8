package batches

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"inferd/openai"
	"inferd/scheduler"
	"inferd/store"
)

// Scheduler is what batches need of the scheduler: each line is a call.
type Scheduler interface {
	Start(ctx context.Context, p store.Project, req scheduler.Request) (store.Call, error)
	Lookup(id string) (store.Call, <-chan struct{}, error)
	Cancel(id string) (store.Call, error)
}

// Store is what batches read of the store.
type Store interface {
	GetProject(id string) (store.Project, error)
	CallByIdempotencyKey(teamID, key string) (store.Call, error)
}

// Config configures a Manager. Zero values take the defaults.
type Config struct {
	Dir          string // <dataDir>/openai: files/ and batches/ under it
	MaxFileBytes int64  // one file (default 100 MiB)
	MaxTeamBytes int64  // all files of a team, outputs included (default 1 GiB)
	Sched        Scheduler
	Store        Store
	Log          zerolog.Logger
	Now          func() time.Time // default time.Now
	// Retry is how long a line refused for a full queue or a team quota
	// waits before it is offered again (default 1 s).
	Retry time.Duration
}

// Manager keeps the files and batches of the Batch API and runs the
// batches, each on a goroutine of its own that Run owns.
type Manager struct {
	cfg     Config
	mu      sync.Mutex
	files   map[string]fileRecord
	batches map[string]*batchRecord
	// runs are the running batches' cancel signals; start is set by Run,
	// so that batches created before it wait for it.
	runs  map[string]chan struct{}
	start func(id string)
	// uploading are the bytes of each team's uploads under way (upload).
	uploading map[string]int64
}

// New opens (or creates) the Batch API's directory and reads what it holds.
func New(cfg Config) (*Manager, error) {
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.MaxTeamBytes <= 0 {
		cfg.MaxTeamBytes = DefaultMaxTeamBytes
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	m := &Manager{cfg: cfg, files: map[string]fileRecord{}, batches: map[string]*batchRecord{}, runs: map[string]chan struct{}{},
		uploading: map[string]int64{}}
	if err := m.load(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Manager) now() time.Time { return m.cfg.Now() }

// Batch statuses (OpenAI's).
const (
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusFailed     = "failed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// CompletionWindow is the one window a batch may ask for, as OpenAI's.
const CompletionWindow = "24h"

// Batch is a batch as the API shows it (OpenAI's batch object).
type Batch struct {
	ID               string            `json:"id"`
	Object           string            `json:"object"` // "batch"
	Endpoint         string            `json:"endpoint"`
	Errors           *ErrorList        `json:"errors"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	OutputFileID     *string           `json:"output_file_id"`
	ErrorFileID      *string           `json:"error_file_id"`
	CreatedAt        int64             `json:"created_at"`
	InProgressAt     *int64            `json:"in_progress_at"`
	ExpiresAt        int64             `json:"expires_at"`
	FinalizingAt     *int64            `json:"finalizing_at"`
	CompletedAt      *int64            `json:"completed_at"`
	FailedAt         *int64            `json:"failed_at"`
	ExpiredAt        *int64            `json:"expired_at"`
	CancellingAt     *int64            `json:"cancelling_at"`
	CancelledAt      *int64            `json:"cancelled_at"`
	RequestCounts    RequestCounts     `json:"request_counts"`
	Metadata         map[string]string `json:"metadata"`
	// Model is the project the lines' model named (an inferd addition).
	Model string `json:"model"`
}

// RequestCounts are a batch's lines: all, succeeded, failed.
type RequestCounts struct {
	Total     int `json:"total"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
}

// ErrorList is a batch's errors, as OpenAI's.
type ErrorList struct {
	Object string      `json:"object"` // "list"
	Data   []LineError `json:"data"`
}

// LineError is one of them.
type LineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Line    *int   `json:"line"`
}

// batchRecord is a batch's stored record.
type batchRecord struct {
	Batch
	Team    string `json:"team"`
	Project string `json:"project"`
	// OutID and ErrID are the ids its output and error files get (shown
	// once written), fixed at creation so that a finalization run again
	// after a restart writes the same files.
	OutID string `json:"outId"`
	ErrID string `json:"errId"`
}

func (b *batchRecord) final() bool {
	switch b.Status {
	case StatusCompleted, StatusFailed, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// CreateRequest is POST /v1/batches' body.
type CreateRequest struct {
	InputFileID      string            `json:"input_file_id"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	Metadata         map[string]string `json:"metadata"`
}

// Resolver finds the project a request's model names among those the
// caller may call.
type Resolver func(model string) (store.Project, bool)

// line is one request of an input file.
type line struct {
	CustomID string          `json:"custom_id"`
	Method   string          `json:"method"`
	URL      string          `json:"url"`
	Body     json.RawMessage `json:"body"`
}

// CreateBatch checks the input file (one acc reaches, else ErrNotFound;
// every line a POST to the batch's endpoint, unique custom_ids, one model
// the caller may call, no stream) and starts a batch of it, of the team of
// the model's project (whose calls its lines are). A bad file is an
// *InputError naming the line; nothing is made.
func (m *Manager) CreateBatch(acc Access, req CreateRequest, resolve Resolver) (Batch, error) {
	switch {
	case !isEndpoint(req.Endpoint):
		return Batch{}, &InputError{Param: "endpoint", Msg: fmt.Sprintf("endpoint must be one of %v", openai.Endpoints)}
	case req.CompletionWindow != CompletionWindow:
		return Batch{}, &InputError{Param: "completion_window", Msg: `completion_window must be "24h"`}
	case len(req.Metadata) > 16:
		return Batch{}, &InputError{Param: "metadata", Msg: "at most 16 metadata pairs"}
	}
	f, err := m.File(acc, req.InputFileID)
	if err != nil {
		return Batch{}, err
	}
	if f.Purpose != PurposeBatch {
		return Batch{}, &InputError{Param: "input_file_id", Msg: fmt.Sprintf("file %s has purpose %q, not %q", f.ID, f.Purpose, PurposeBatch)}
	}
	model, n, err := m.checkInput(f.ID, req.Endpoint)
	if err != nil {
		return Batch{}, err
	}
	p, ok := resolve(model)
	if !ok {
		return Batch{}, &InputError{Param: "model", Msg: fmt.Sprintf("the model %q does not exist or you do not have access to it", model)}
	}
	now := m.now().Unix()
	id := newID("batch_")
	b := &batchRecord{
		Batch: Batch{
			ID: id, Object: "batch", Endpoint: req.Endpoint, InputFileID: f.ID, CompletionWindow: CompletionWindow,
			Status: StatusInProgress, CreatedAt: now, InProgressAt: &now, ExpiresAt: now + 24*3600,
			RequestCounts: RequestCounts{Total: n}, Metadata: req.Metadata, Model: p.ID,
		},
		Team: p.TeamID, Project: p.ID,
		OutID: "file-" + id[len("batch_"):] + "-out", ErrID: "file-" + id[len("batch_"):] + "-err",
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.saveBatch(b); err != nil {
		return Batch{}, err
	}
	if m.start != nil {
		m.start(id)
	}
	return b.view(), nil
}

func isEndpoint(e string) bool {
	for _, x := range openai.Endpoints {
		if e == x {
			return true
		}
	}
	return false
}

// checkInput reads an input file through and returns the model its lines
// name and how many there are.
func (m *Manager) checkInput(fileID, endpoint string) (model string, n int, err error) {
	seen := map[string]bool{}
	err = m.eachLine(fileID, func(i int, l line) error {
		n++
		bad := func(param, format string, args ...any) error {
			return &InputError{Param: param, Line: i, Msg: fmt.Sprintf(format, args...)}
		}
		switch {
		case n > MaxLines:
			return bad("input_file_id", "a batch holds at most %d requests", MaxLines)
		case l.CustomID == "" || len(l.CustomID) > 512:
			return bad("custom_id", "custom_id must be a string of 1 to 512 characters")
		case seen[l.CustomID]:
			return bad("custom_id", "custom_id %q is used twice", l.CustomID)
		case l.Method != "POST":
			return bad("method", "method must be POST")
		case l.URL != endpoint:
			return bad("url", "url %q differs from the batch's endpoint %s", l.URL, endpoint)
		}
		seen[l.CustomID] = true
		req, err := openai.ParseRequest(endpoint, l.Body)
		var re *openai.RequestError
		switch {
		case errors.As(err, &re):
			return bad("body."+re.Param, "%s", re.Msg)
		case err != nil:
			return err
		case req.Stream:
			return bad("body.stream", "a batch request cannot stream")
		case model != "" && req.Model != model:
			return bad("body.model", "every request of a batch must name one model (%q, then %q)", model, req.Model)
		}
		model = req.Model
		return nil
	})
	if err == nil && n == 0 {
		err = &InputError{Param: "input_file_id", Msg: "the input file holds no requests"}
	}
	return model, n, err
}

// eachLine calls fn with each non-blank line of file id, decoded, and its
// number (1-based).
func (m *Manager) eachLine(id string, fn func(i int, l line) error) error {
	f, err := os.Open(m.contentPath(id))
	if err != nil {
		return fmt.Errorf("open file %s: %w", id, err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	for i := 1; ; i++ {
		raw, rerr := r.ReadBytes('\n')
		if t := bytes.TrimSpace(raw); len(t) > 0 {
			var l line
			if err := json.Unmarshal(t, &l); err != nil || l.Body == nil {
				return &InputError{Param: "input_file_id", Line: i, Msg: "each line must be a JSON object with custom_id, method, url and body"}
			}
			if err := fn(i, l); err != nil {
				return err
			}
		}
		if rerr == io.EOF {
			return nil
		}
		if rerr != nil {
			return fmt.Errorf("read file %s: %w", id, rerr)
		}
	}
}

// Batch returns batch id, if acc reaches it, its counts as they stand.
func (m *Manager) Batch(acc Access, id string) (Batch, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.batch(acc, id)
	if !ok {
		return Batch{}, ErrNotFound
	}
	return b.view(), nil
}

// batch returns batch id if acc reaches it: one it does not is as absent
// as one that never was; m.mu is held.
func (m *Manager) batch(acc Access, id string) (*batchRecord, bool) {
	b, ok := m.batches[id]
	return b, ok && acc.reachesBatch(b)
}

// CancelBatch asks batch id, if acc reaches it, to stop: its calls not
// yet finished are cancelled, and it ends cancelled with the results of
// those that did.
func (m *Manager) CancelBatch(acc Access, id string) (Batch, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.batch(acc, id)
	if !ok {
		return Batch{}, ErrNotFound
	}
	if b.final() || b.Status == StatusCancelling {
		return b.view(), nil
	}
	prev := *b
	now := m.now().Unix()
	b.Status, b.CancellingAt = StatusCancelling, &now
	if err := m.saveBatch(b); err != nil {
		*b = prev
		return Batch{}, err
	}
	if stop, ok := m.runs[id]; ok {
		close(stop)
		delete(m.runs, id)
	}
	return b.view(), nil
}

// view is the batch as the API shows it; m.mu is held.
func (b *batchRecord) view() Batch {
	v := b.Batch
	if v.Metadata == nil {
		v.Metadata = map[string]string{}
	}
	return v
}

func (m *Manager) batchPath(id string) string { return filepath.Join(m.cfg.Dir, "batches", id+".json") }

// saveBatch writes a batch record durably and indexes it; m.mu is held.
func (m *Manager) saveBatch(b *batchRecord) error {
	if err := writeJSON(m.batchPath(b.ID), b); err != nil {
		return err
	}
	m.batches[b.ID] = b
	return nil
}
