// Package batches is the OpenAI Batch API on inferd's durable calls
// (docs/openai.md "Batch API"), a client of the scheduler beside it (it
// reads package openai's wire format, which knows nothing of it): files uploaded with purpose "batch" (JSONL,
// one request a line), batches that run each line as a call of the
// project its model names, and the output and error files they write.
//
// Files and batches live in the data dir, not the store: a file is up to
// Config.MaxFileBytes of bytes that bbolt would keep for ever (its file
// never shrinks) and etcd could not hold, and a batch is a small record
// next to them. Each is written as a file and its JSON metadata, each
// fsynced and renamed into place (then the directory fsynced), so a kill
// -9 leaves either the whole of it or nothing. The calls themselves are
// the store's like any others: each line's call is started with an
// idempotency key derived from its batch and line, so a runner resumed
// after a restart finds the calls already made and makes only the rest.
package batches

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"inferd/internal/durable"
)

// Defaults of Config's zero values.
const (
	DefaultMaxFileBytes = 100 << 20
	DefaultMaxTeamBytes = 1 << 30
	DefaultMaxBodyBytes = 10 << 20
	// DefaultCreatesPerTeam: a team's creates at once.
	DefaultCreatesPerTeam = 2
	// DefaultMaxFilesPerTeam: a team's files, empty ones included.
	DefaultMaxFilesPerTeam = 1000
	// lineEnvelope is what a line may add to its body: custom_id (up to
	// 512 characters), method, url and the JSON around them.
	lineEnvelope = 4 << 10
	// MaxLines bounds the requests of one batch, as OpenAI's does.
	MaxLines = 50000
	// maxFilename bounds a stored file name.
	maxFilename = 255
)

// Purposes of a file: uploaded for a batch, or written by one.
const (
	PurposeBatch       = "batch"
	PurposeBatchOutput = "batch_output"
)

// Errors of the Manager; a *InputError says what is wrong with a request.
var (
	// ErrNotFound: no such file or batch, or another team's (the same
	// answer, so an id of another team tells nothing).
	ErrNotFound = errors.New("not found")
	// ErrTooLarge: a file over MaxFileBytes.
	ErrTooLarge = errors.New("file too large")
)

// InputError is a request the Manager refuses; Param names the field, Line
// the line of the input file (1-based; 0: none).
type InputError struct {
	Param string
	Line  int
	Msg   string
}

func (e *InputError) Error() string {
	if e.Line > 0 {
		return fmt.Sprintf("line %d of the input file: %s", e.Line, e.Msg)
	}
	return e.Msg
}

// BudgetError is an upload that would take a team over its bytes.
type BudgetError struct{ Have, Max int64 }

func (e *BudgetError) Error() string {
	return fmt.Sprintf("this upload would take your team's files over their budget (%d bytes of %d held; openai.maxTeamFileBytes); delete files with DELETE /v1/files/ID", e.Have, e.Max)
}

// Budgets are the settings a LimitError may name, for the refusal
// counter's series.
var Budgets = []string{"openai.createsPerTeam", "openai.maxFilesPerTeam"}

// LimitError is a request refused by one of the Batch API's budgets:
// Budget is its setting, Code OpenAI's error code, and Retry says that
// waiting helps (the budget frees itself as work ends).
type LimitError struct {
	Budget string
	Code   string
	Msg    string
	Retry  bool
}

func (e *LimitError) Error() string { return e.Msg }

// File is a stored file as the API shows it.
type File struct {
	ID        string `json:"id"`
	Object    string `json:"object"` // "file"
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
}

// fileRecord is a file's stored metadata.
type fileRecord struct {
	File
	Team string `json:"team"`
	// Projects are the projects the file concerns (Access.reachesFile):
	// an upload's, those its key was limited to (none: any of its team's);
	// an output file's, its batch's project.
	Projects []string `json:"projects,omitempty"`
}

// newID returns prefix and 24 random hex digits, as OpenAI's ids look; in
// cluster mode the node's name and a dot come between (Holder).
func (m *Manager) newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
	if m.cfg.Node != "" {
		return prefix + m.cfg.Node + "." + hex.EncodeToString(b[:])
	}
	return prefix + hex.EncodeToString(b[:])
}

// Holder names the node that holds file or batch id, as the id says it:
// "file-NODE.HEX" (an output file "file-NODE.HEX-out"), "batch_NODE.HEX".
// It is "" for an id made on a single box, or one that is no id of the
// Batch API: such an id is looked up where it is asked for. A node name
// (cluster.name) is a DNS label, so it has no dot, and the hex none.
func Holder(id string) string {
	rest, ok := strings.CutPrefix(id, "file-")
	if !ok {
		if rest, ok = strings.CutPrefix(id, "batch_"); !ok {
			return ""
		}
	}
	node, _, ok := strings.Cut(rest, ".")
	if !ok {
		return ""
	}
	return node
}

// PutFile stores content as a new file of acc's team, concerning the
// projects acc reaches, and returns it. The content is streamed to disk
// within MaxFileBytes (ErrTooLarge) and the team's MaxTeamBytes (a
// *BudgetError), each checked before a byte beyond it is written; nothing
// is kept on a refusal.
func (m *Manager) PutFile(acc Access, filename, purpose string, content io.Reader) (File, error) {
	if purpose != PurposeBatch {
		return File{}, &InputError{Param: "purpose", Msg: fmt.Sprintf("purpose must be %q: inferd keeps files for the Batch API only", PurposeBatch)}
	}
	f := File{ID: m.newID("file-"), Object: "file", CreatedAt: m.now().Unix(), Filename: cleanFilename(filename), Purpose: purpose}
	if err := m.enterUpload(acc.Team); err != nil {
		return File{}, err
	}
	up := &upload{m: m, team: acc.Team, max: m.cfg.MaxFileBytes}
	n, err := m.writeContent(f.ID, func(w io.Writer) (int64, error) {
		up.w = w
		return io.Copy(up, content)
	})
	m.mu.Lock()
	defer m.mu.Unlock()
	m.leaveUpload(acc.Team) // the file counts as the team's from here, as its bytes
	up.release()            // do, the lock held throughout
	if err != nil {
		return File{}, err
	}
	f.Bytes = n
	if err := m.saveFile(fileRecord{File: f, Team: acc.Team, Projects: slices.Clone(acc.Projects)}); err != nil {
		m.removeContent(f.ID)
		return File{}, err
	}
	return f, nil
}

// reserveStep is how much of its team's bytes an upload reserves at a
// time: the team's files are summed once per step, not once per write.
const reserveStep = 1 << 20

// upload writes a file's content within max bytes (an upload's
// MaxFileBytes; a batch's output, the team's bytes) and its team's
// MaxTeamBytes. Each write is reserved against the team's bytes (its
// files and the uploads under way, Manager.uploading) before it is
// written, so that neither bound is passed on disk, even by two uploads
// at once.
type upload struct {
	m        *Manager
	team     string
	max      int64
	w        io.Writer
	n        int64 // written
	reserved int64 // of the team's bytes, in Manager.uploading
}

func (u *upload) Write(p []byte) (int, error) {
	if err := u.room(len(p)); err != nil {
		return 0, err
	}
	n, err := u.w.Write(p)
	u.n += int64(n)
	return n, err
}

// room reserves what writing n more bytes needs, or refuses them: an
// ErrTooLarge past max, a *BudgetError past the team's bytes.
func (u *upload) room(n int) error {
	next := u.n + int64(n)
	if next > u.max {
		return fmt.Errorf("%w: larger than %d bytes", ErrTooLarge, u.max)
	}
	if next > u.reserved {
		return u.reserve(next - u.reserved)
	}
	return nil
}

// reserve takes need more of the team's bytes (a step when there is room
// for one), or refuses them.
func (u *upload) reserve(need int64) error {
	m := u.m
	m.mu.Lock()
	defer m.mu.Unlock()
	held := m.teamBytes(u.team) + m.uploading[u.team]
	room := m.cfg.MaxTeamBytes - held
	if need > room {
		return &BudgetError{Have: held, Max: m.cfg.MaxTeamBytes}
	}
	take := min(max(need, reserveStep), room, u.max-u.reserved)
	u.reserved += take
	m.uploading[u.team] += take
	return nil
}

// release gives back what the upload reserved; m.mu is held.
func (u *upload) release() {
	if left := u.m.uploading[u.team] - u.reserved; left > 0 {
		u.m.uploading[u.team] = left
	} else {
		delete(u.m.uploading, u.team)
	}
	u.reserved = 0
}

// cleanFilename keeps a file name for display: its base, bounded.
func cleanFilename(name string) string {
	name = filepath.Base(strings.ReplaceAll(name, "\\", "/"))
	if name == "." || name == "/" {
		name = ""
	}
	if len(name) > maxFilename {
		name = name[:maxFilename]
	}
	return strings.ToValidUTF8(name, "")
}

// File returns file id if acc reaches it.
func (m *Manager) File(acc Access, id string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.file(acc, id)
	if !ok {
		return File{}, ErrNotFound
	}
	return r.File, nil
}

// file returns file id if acc reaches it: one it does not is as absent
// as one that never was; m.mu is held.
func (m *Manager) file(acc Access, id string) (fileRecord, bool) {
	r, ok := m.files[id]
	return r, ok && acc.reachesFile(r)
}

// OpenContent opens file id, if acc reaches it, for reading; the caller
// closes it.
func (m *Manager) OpenContent(acc Access, id string) (*os.File, File, error) {
	f, err := m.File(acc, id)
	if err != nil {
		return nil, File{}, err
	}
	c, err := os.Open(m.contentPath(id))
	if err != nil {
		return nil, File{}, fmt.Errorf("open file %s: %w", id, err)
	}
	return c, f, nil
}

// DeleteFile deletes file id if acc reaches it. A file a running batch
// reads is refused.
func (m *Manager) DeleteFile(acc Access, id string) (File, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.file(acc, id)
	if !ok {
		return File{}, ErrNotFound
	}
	for _, b := range m.batches { // those not yet ended
		if b.InputFileID == id {
			return File{}, &InputError{Param: "file_id", Msg: "batch " + b.ID + " still reads this file; cancel it first"}
		}
	}
	if err := durable.Remove(m.metaPath(id)); err != nil {
		return File{}, err
	}
	m.removeContent(id)
	delete(m.files, id)
	return r.File, nil
}

// enterUpload takes one of team's files for an upload, or refuses it: the
// team's files, its uploads under way and two for each of its batches not
// yet ended (their output and error files) are at most MaxFilesPerTeam.
func (m *Manager) enterUpload(team string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.fileRoom(team, 1); err != nil {
		return err
	}
	m.uploadingFiles[team]++
	return nil
}

// leaveUpload gives back an upload's file; m.mu is held.
func (m *Manager) leaveUpload(team string) {
	if m.uploadingFiles[team]--; m.uploadingFiles[team] <= 0 {
		delete(m.uploadingFiles, team)
	}
}

// fileRoom refuses n more files of team past MaxFilesPerTeam; m.mu is
// held.
func (m *Manager) fileRoom(team string, n int) error {
	held := m.uploadingFiles[team]
	for _, r := range m.files {
		if r.Team == team {
			held++
		}
	}
	for _, b := range m.batches { // those not yet ended
		if b.Team == team {
			held += 2
		}
	}
	if held+n > m.cfg.MaxFilesPerTeam {
		return &LimitError{Budget: "openai.maxFilesPerTeam", Code: "file_count_budget",
			Msg: fmt.Sprintf("your team holds %d files (its batches not yet ended count two each, for their results), as many as it may (openai.maxFilesPerTeam); delete files with DELETE /v1/files/ID", held)}
	}
	return nil
}

// teamBytes is what team's files hold; m.mu is held.
func (m *Manager) teamBytes(team string) int64 {
	var n int64
	for _, r := range m.files {
		if r.Team == team {
			n += r.Bytes
		}
	}
	return n
}

func (m *Manager) contentPath(id string) string { return filepath.Join(m.cfg.Dir, "files", id) }
func (m *Manager) metaPath(id string) string    { return filepath.Join(m.cfg.Dir, "files", id+".json") }

// writeContent writes a file's content durably (write, fsync, rename) with
// fill and returns its size.
func (m *Manager) writeContent(id string, fill func(io.Writer) (int64, error)) (int64, error) {
	var n int64
	err := durable.Replace(m.contentPath(id), func(w io.Writer) error {
		var err error
		n, err = fill(w)
		return err
	})
	return n, err
}

func (m *Manager) removeContent(id string) {
	if err := os.Remove(m.contentPath(id)); err != nil && !errors.Is(err, os.ErrNotExist) {
		m.cfg.Log.Warn().Err(err).Str("file", id).Msg("removing a batch file failed")
	}
}

// saveFile writes a file's metadata durably and indexes it; m.mu is held.
func (m *Manager) saveFile(r fileRecord) error {
	if err := writeJSON(m.metaPath(r.ID), r); err != nil {
		return err
	}
	m.files[r.ID] = r
	return nil
}

// writeJSON writes v as JSON to path durably.
func writeJSON(path string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("encode %s: %w", filepath.Base(path), err)
	}
	return durable.Replace(path, func(w io.Writer) error { _, err := w.Write(b); return err })
}

// load reads the metadata of every file and batch in the data dir and
// removes temporary files a crash left. Of a batch that has ended only
// its endedBatch is kept.
func (m *Manager) load() error {
	for _, sub := range []string{"files", "batches"} {
		dir := filepath.Join(m.cfg.Dir, sub)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("batch API dir: %w", err)
		}
		entries, err := os.ReadDir(dir)
		if err != nil {
			return fmt.Errorf("batch API dir: %w", err)
		}
		for _, e := range entries {
			name := e.Name()
			path := filepath.Join(dir, name)
			switch {
			case strings.HasPrefix(name, durable.TempPrefix):
				_ = os.Remove(path)
			case !strings.HasSuffix(name, ".json"):
				continue
			case sub == "files":
				var r fileRecord
				if err := readJSON(path, &r); err != nil {
					return err
				}
				m.files[r.ID] = r
			default:
				var r batchRecord
				if err := readJSON(path, &r); err != nil {
					return err
				}
				m.index(&r)
			}
		}
	}
	return nil
}

func readJSON(path string, v any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s is not valid JSON (remove it to start without it): %w", path, err)
	}
	return nil
}

// sortedIDs returns the keys of a map of records, sorted.
func sortedIDs[V any](m map[string]V) []string {
	ids := make([]string, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}
