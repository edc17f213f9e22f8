package batches

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
	"unicode/utf8"

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
	// MaxBodyBytes bounds each line's request body, as maxBodyBytes bounds
	// a request posted directly (default 10 MiB).
	MaxBodyBytes int64
	// CreatesPerTeam bounds a team's creates checking their input files at
	// once (default DefaultCreatesPerTeam).
	CreatesPerTeam int
	// Retention is how long a file is kept after its creation, and an
	// ended batch after it ended (default DefaultRetention: retention.go).
	Retention time.Duration
	// MaxQueuedPerProject and MaxQueuedBytesPerProject are the scheduler's
	// bounds of a project's queue (maxQueuedPerProject,
	// maxQueuedBytesPerProject): a project's batches together keep half of
	// each to themselves at most (lanes.go). Defaults: the scheduler's.
	MaxQueuedPerProject      int
	MaxQueuedBytesPerProject int64
	// MaxFilesPerTeam bounds a team's files, empty ones and the two each
	// of its batches not yet ended will write included (default
	// DefaultMaxFilesPerTeam).
	MaxFilesPerTeam int
	Sched           Scheduler
	Store           Store
	Log             zerolog.Logger
	// Clock is the time a batch is created at and expires by (default
	// the time package's): the scheduler's own, so that a batch's calls
	// and its completion window keep one time.
	Clock scheduler.Clock
	// Retry is how long a line refused for a full queue or a team quota
	// waits before it is offered again (default 1 s).
	Retry time.Duration
	// Node is this node's cluster.name in cluster mode ("" on a single
	// box): the ids of what this Manager makes name it (Holder), so that
	// any node of the cluster knows which node holds a file or batch.
	Node string
}

// Manager keeps the files and batches of the Batch API and runs the
// batches, each on a goroutine of its own that Run owns.
type Manager struct {
	cfg   Config
	mu    sync.Mutex
	files map[string]fileRecord
	// batches are the batches not yet ended, whole; ended those that
	// have, of which only what finds, lists and expires them is held
	// (endedBatch): the rest is read from the record when asked for.
	batches map[string]*batchRecord
	ended   map[string]endedBatch
	// runs are the running batches' cancel signals; start is set by Run,
	// so that batches created before it wait for it.
	runs  map[string]chan struct{}
	start func(id string)
	// uploading are the bytes of each team's uploads under way (upload).
	uploading map[string]int64
	// lanes are the calls of each project's batches in flight (lanes.go).
	lanes lanes
	// creating counts each team's creates under way (CreateBatch),
	// uploadingFiles its uploads under way (PutFile).
	creating       map[string]int
	uploadingFiles map[string]int
}

// New opens (or creates) the Batch API's directory and reads what it holds.
func New(cfg Config) (*Manager, error) {
	if cfg.MaxFileBytes <= 0 {
		cfg.MaxFileBytes = DefaultMaxFileBytes
	}
	if cfg.MaxTeamBytes <= 0 {
		cfg.MaxTeamBytes = DefaultMaxTeamBytes
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.CreatesPerTeam <= 0 {
		cfg.CreatesPerTeam = DefaultCreatesPerTeam
	}
	if cfg.Retention <= 0 {
		cfg.Retention = DefaultRetention
	}
	if cfg.MaxQueuedPerProject <= 0 {
		cfg.MaxQueuedPerProject = scheduler.DefaultMaxQueuedPerProject
	}
	if cfg.MaxQueuedBytesPerProject <= 0 {
		cfg.MaxQueuedBytesPerProject = scheduler.DefaultMaxQueuedBytes
	}
	if cfg.MaxFilesPerTeam <= 0 {
		cfg.MaxFilesPerTeam = DefaultMaxFilesPerTeam
	}
	if cfg.Clock == nil {
		cfg.Clock = scheduler.RealClock()
	}
	if cfg.Retry <= 0 {
		cfg.Retry = time.Second
	}
	m := &Manager{cfg: cfg, files: map[string]fileRecord{}, batches: map[string]*batchRecord{}, ended: map[string]endedBatch{}, runs: map[string]chan struct{}{},
		uploading: map[string]int64{}, creating: map[string]int{}, uploadingFiles: map[string]int{}, lanes: lanes{used: map[string]*laneUse{}}}
	if err := m.load(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *Manager) now() time.Time { return m.cfg.Clock.Now() }

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

func (b *batchRecord) final() bool { return b.endedAt() != 0 }

// endedAt is when the batch ended; 0 while it runs.
func (b *batchRecord) endedAt() int64 {
	var at *int64
	switch b.Status {
	case StatusCompleted:
		at = b.CompletedAt
	case StatusFailed:
		at = b.FailedAt
	case StatusExpired:
		at = b.ExpiredAt
	case StatusCancelled:
		at = b.CancelledAt
	default:
		return 0
	}
	if at == nil || *at == 0 {
		return b.CreatedAt // a record that says no more
	}
	return *at
}

// endedBatch is what a Manager holds of a batch that has ended.
type endedBatch struct {
	ID, Team, Project string
	CreatedAt         int64
	// EndedAt is when it ended: its output and error files were made then
	// too, so they expire with it.
	EndedAt int64
}

func (b *batchRecord) ended() endedBatch {
	return endedBatch{ID: b.ID, Team: b.Team, Project: b.Project, CreatedAt: b.CreatedAt, EndedAt: b.endedAt()}
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
	}
	if err := checkMetadata(req.Metadata); err != nil {
		return Batch{}, err
	}
	f, err := m.File(acc, req.InputFileID)
	if err != nil {
		return Batch{}, err
	}
	if err := m.enterCreate(acc.Team); err != nil {
		return Batch{}, err
	}
	defer m.leaveCreate(acc.Team)
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
	id := m.newID("batch_")
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
	if err := m.fileRoom(b.Team, 2); err != nil { // its output and error files
		return Batch{}, err
	}
	if err := m.saveBatch(b); err != nil {
		return Batch{}, err
	}
	if m.start != nil {
		m.start(id)
	}
	return b.view(), nil
}

// Metadata bounds, as OpenAI's.
const (
	maxMetadataPairs = 16
	maxMetadataKey   = 64  // characters
	maxMetadataValue = 512 // characters
)

// checkMetadata holds a batch's metadata to OpenAI's bounds: 16 pairs,
// keys of up to 64 characters, values of up to 512.
func checkMetadata(md map[string]string) error {
	if len(md) > maxMetadataPairs {
		return &InputError{Param: "metadata", Msg: fmt.Sprintf("metadata holds at most %d pairs, not %d", maxMetadataPairs, len(md))}
	}
	for _, k := range slices.Sorted(maps.Keys(md)) {
		switch {
		case utf8.RuneCountInString(k) > maxMetadataKey:
			return &InputError{Param: "metadata", Msg: fmt.Sprintf("metadata keys are at most %d characters; %q… is longer", maxMetadataKey, string([]rune(k)[:16]))}
		case utf8.RuneCountInString(md[k]) > maxMetadataValue:
			return &InputError{Param: "metadata", Msg: fmt.Sprintf("metadata values are at most %d characters; that of %q is longer", maxMetadataValue, k)}
		}
	}
	return nil
}

// enterCreate takes one of team's creates at once, or refuses it: each
// holds up to a line's budget while it reads its input file through.
func (m *Manager) enterCreate(team string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.creating[team] >= m.cfg.CreatesPerTeam {
		return &LimitError{Budget: "openai.createsPerTeam", Code: "too_many_creates", Retry: true,
			Msg: fmt.Sprintf("your team has %d batches being created, as many as it may at once (openai.createsPerTeam); retry once one is answered", m.cfg.CreatesPerTeam)}
	}
	m.creating[team]++
	return nil
}

func (m *Manager) leaveCreate(team string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.creating[team]--; m.creating[team] <= 0 {
		delete(m.creating, team)
	}
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
	err = m.eachLine(fileID, func(i int, l line, lineErr *InputError) error {
		n++
		if lineErr != nil {
			return lineErr
		}
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

// eachLine calls fn with each non-blank line of file id and its number
// (1-based): decoded, or with bad saying why it could not be. A line is
// held to maxBodyBytes as a request's body is (its body to MaxBodyBytes,
// the line to that and lineEnvelope) and read into memory only that far:
// a longer one is read past to its end and dropped, so a file of one 100
// MiB line costs a create or a run no more than one request's budget.
func (m *Manager) eachLine(id string, fn func(i int, l line, bad *InputError) error) error {
	f, err := os.Open(m.contentPath(id))
	if err != nil {
		return fmt.Errorf("open file %s: %w", id, err)
	}
	defer f.Close()
	r := bufio.NewReaderSize(f, 64<<10)
	var buf []byte // the line, reused
	for i := 1; ; i++ {
		raw, over, rerr := readLine(r, buf[:0], m.cfg.MaxBodyBytes+lineEnvelope)
		buf = raw
		if t := bytes.TrimSpace(raw); over || len(t) > 0 {
			var l line
			var bad *InputError
			switch {
			case !over && (json.Unmarshal(t, &l) != nil || l.Body == nil):
				bad = &InputError{Param: "input_file_id", Line: i, Msg: "each line must be a JSON object with custom_id, method, url and body"}
			case over || int64(len(l.Body)) > m.cfg.MaxBodyBytes:
				bad = &InputError{Param: "body", Line: i, Msg: fmt.Sprintf("the request is larger than %d bytes, the most a request body may be (maxBodyBytes)", m.cfg.MaxBodyBytes)}
			}
			if err := fn(i, l, bad); err != nil {
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

// readLine appends the next line of r (without its newline) to buf, up to
// max bytes; over reports a longer line, whose rest was read past and
// dropped. The error is io.EOF after the last line.
func readLine(r *bufio.Reader, buf []byte, max int64) (line []byte, over bool, err error) {
	for {
		frag, err := r.ReadSlice('\n')
		if !over {
			if int64(len(buf)+len(frag)) > max+1 { // +1: the newline
				over, buf = true, buf[:0]
			} else {
				buf = append(buf, frag...)
			}
		}
		if err != bufio.ErrBufferFull {
			return bytes.TrimSuffix(buf, []byte("\n")), over, err
		}
	}
}

// Batch returns batch id, if acc reaches it, its counts as they stand.
func (m *Manager) Batch(acc Access, id string) (Batch, error) {
	m.mu.Lock()
	b, ok := m.batch(acc, id)
	if ok {
		defer m.mu.Unlock()
		return b.view(), nil
	}
	e, ok := m.ended[id]
	m.mu.Unlock()
	if !ok || !acc.reachesBatch(e.Team, e.Project) {
		return Batch{}, ErrNotFound
	}
	return m.readEnded(id)
}

// readEnded reads an ended batch's record; one removed meanwhile (expired)
// is ErrNotFound.
func (m *Manager) readEnded(id string) (Batch, error) {
	var r batchRecord
	if err := readJSON(m.batchPath(id), &r); errors.Is(err, os.ErrNotExist) {
		return Batch{}, ErrNotFound
	} else if err != nil {
		return Batch{}, err
	}
	return r.view(), nil
}

// batch returns batch id, not yet ended, if acc reaches it: one it does
// not is as absent as one that never was; m.mu is held.
func (m *Manager) batch(acc Access, id string) (*batchRecord, bool) {
	b, ok := m.batches[id]
	return b, ok && acc.reachesBatch(b.Team, b.Project)
}

// CancelBatch asks batch id, if acc reaches it, to stop: its calls not
// yet finished are cancelled, and it ends cancelled with the results of
// those that did.
func (m *Manager) CancelBatch(acc Access, id string) (Batch, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	b, ok := m.batch(acc, id)
	if !ok {
		if e, ok := m.ended[id]; ok && acc.reachesBatch(e.Team, e.Project) {
			return m.readEnded(id) // ended: nothing to cancel
		}
		return Batch{}, ErrNotFound
	}
	if b.Status == StatusCancelling {
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

// saveBatch writes a batch record durably and indexes it: whole while it
// runs, as an endedBatch once it has ended; m.mu is held.
func (m *Manager) saveBatch(b *batchRecord) error {
	if err := writeJSON(m.batchPath(b.ID), b); err != nil {
		return err
	}
	m.index(b)
	return nil
}

// index holds batch b as it stands; m.mu is held.
func (m *Manager) index(b *batchRecord) {
	if b.final() {
		delete(m.batches, b.ID)
		m.ended[b.ID] = b.ended()
		return
	}
	m.batches[b.ID] = b
}
