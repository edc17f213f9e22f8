package local

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
)

// maxLineBytes caps the line kept for LastLogLine; longer lines are cut.
const maxLineBytes = 500

// logSink receives the model's stdout and stderr: it appends them to a size-capped
// file and remembers the last non-empty line. Write never fails, so a full disk
// cannot block the model on a full pipe; the first file error is reported through
// onErr and later ones are dropped.
type logSink struct {
	path   string // "" = keep no file, only the last line
	max    int64
	keep   int        // old generations kept: path.1 (newest) .. path.<keep>
	budget *logBudget // the project's; nil = none
	onErr  func(error)

	mu      sync.Mutex
	f       *os.File
	size    int64
	failed  bool
	last    string // last complete non-empty line
	partial []byte // current line so far, at most maxLineBytes
}

// openLogSink opens (appending to) path, creating its parent directories;
// both are inferd's user's only (privatefiles.go): another team's model
// must not read them, whatever the data dir's mode.
// budget, when not nil, is the project's log budget, which the file then
// counts toward (see logbudget.go).
func openLogSink(path string, maxBytes int64, keep int, budget *logBudget, onErr func(error)) (*logSink, error) {
	s := &logSink{path: path, max: maxBytes, keep: max(keep, 1), onErr: onErr}
	if path == "" {
		return s, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), privateDirMode); err != nil {
		return nil, fmt.Errorf("create log dir: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, privateFileMode)
	if err != nil {
		return nil, fmt.Errorf("open log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("stat log: %w", err)
	}
	s.f, s.size = f, st.Size()
	if budget != nil {
		s.budget = budget
		budget.attach(path)
	}
	return s, nil
}

// Write appends p to the file, rotating it once it exceeds max, and tracks lines.
func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.trackLines(p)
	if s.f == nil {
		return len(p), nil
	}
	n, err := s.f.Write(p)
	s.size += int64(n)
	if err == nil && s.size > s.max {
		err = s.rotate()
	}
	if err == nil && s.budget != nil && s.budget.wrote(int64(n)) && s.size > 0 {
		// Only live replicas' files are left to take from: start afresh,
		// so that what this one wrote before can go.
		if err = s.rotate(); err == nil {
			s.budget.trimmed()
		}
	}
	if err != nil && !s.failed {
		s.failed = true
		s.onErr(err)
	}
	return len(p), nil
}

// rotate shifts the old generations up by one (path.<keep> falls off the end),
// moves the full file to path.1 and starts a new one. Callers hold mu.
func (s *logSink) rotate() error {
	if err := s.f.Close(); err != nil {
		return fmt.Errorf("close log: %w", err)
	}
	s.f = nil
	for i := s.keep - 1; i >= 1; i-- {
		err := os.Rename(generation(s.path, i), generation(s.path, i+1))
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("rotate log: %w", err)
		}
	}
	if err := os.Rename(s.path, generation(s.path, 1)); err != nil {
		return fmt.Errorf("rotate log: %w", err)
	}
	f, err := os.OpenFile(s.path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, privateFileMode)
	if err != nil {
		return fmt.Errorf("reopen log: %w", err)
	}
	s.f, s.size = f, 0
	return nil
}

// trackLines updates last and partial from p. Both \n and \r end a line, so progress
// bars that redraw with \r still yield their latest state. Callers hold mu.
func (s *logSink) trackLines(p []byte) {
	for len(p) > 0 {
		i := bytes.IndexAny(p, "\r\n")
		chunk := p
		if i >= 0 {
			chunk = p[:i]
		}
		if room := maxLineBytes - len(s.partial); len(chunk) > room {
			chunk = chunk[:room]
		}
		s.partial = append(s.partial, chunk...)
		if i < 0 {
			return
		}
		if line := bytes.TrimSpace(s.partial); len(line) > 0 {
			s.last = strings.ToValidUTF8(string(line), "")
		}
		s.partial = s.partial[:0]
		p = p[i+1:]
	}
}

// LastLine returns the last non-empty line, counting an unterminated last line.
func (s *logSink) LastLine() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if line := bytes.TrimSpace(s.partial); len(line) > 0 {
		return strings.ToValidUTF8(string(line), "")
	}
	return s.last
}

// Close closes the file; later writes only track lines.
func (s *logSink) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	if s.budget != nil {
		s.budget.detach(s.path)
		s.budget = nil
	}
	return err
}
