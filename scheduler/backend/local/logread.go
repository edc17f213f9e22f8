package local

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"inferd/scheduler/backend"
)

// Replica logs on disk: dir/<team>/<project>/<replica>.log is the file being
// written, and <replica>.log.1 (newest) to .log.<LogKeep> the older
// generations. They outlive the replica, so that a crash can be read after
// the fact; the next replica with the same id appends to the same file. The
// team is part of the path so that a project deleted and made again for
// another team, or moved to one, never shows the new team the old team's
// output.

const logSuffix = ".log"

// followPoll is how often a followed log is checked for new output.
const followPoll = 250 * time.Millisecond

// LogPath returns the log file of a replica under the logs directory dir.
func LogPath(dir, team, project, replica string) string {
	return filepath.Join(dir, team, project, replica+logSuffix)
}

// logPath is where spec's replica logs to; "" = nowhere.
func (b *Backend) logPath(spec backend.Spec) string {
	if b.cfg.LogDir == "" {
		return ""
	}
	return LogPath(b.cfg.LogDir, spec.TeamID, spec.ProjectID, spec.ReplicaID)
}

// generation returns the name of old generation n (n ≥ 1) of the log at path.
func generation(path string, n int) string {
	return path + "." + strconv.Itoa(n)
}

// LogDir reads the replica logs kept under a directory, as backend.Logs: the
// Backend's are read through one, and the admin commands read them with one
// when no daemon runs. "" holds no logs.
type LogDir string

var _ backend.Logs = LogDir("")

// ReplicaLogs lists project's replica logs; see backend.Logs. A name that
// could not be a directory of ours (such as "..") has no logs.
func (d LogDir) ReplicaLogs(team, project string) ([]backend.Log, error) {
	if d == "" || !pathName(project) || (team != "" && !pathName(team)) {
		return nil, nil
	}
	files, err := findLogs(string(d), team, project)
	if err != nil {
		return nil, err
	}
	logs := make([]backend.Log, len(files))
	for i, f := range files {
		logs[i] = f.log
	}
	return logs, nil
}

// TailLog returns the last n lines of l; see backend.Logs.
func (d LogDir) TailLog(l backend.Log, n int) (lines []string, next int64, err error) {
	path, ok := d.pathOf(l)
	if !ok {
		return nil, 0, backend.ErrNoLog
	}
	// The size first: a follow from there repeats a line written meanwhile
	// rather than miss it.
	if next, err = logSize(path); err == nil {
		lines, err = tailLog(path, n)
	}
	switch {
	case errors.Is(err, os.ErrNotExist):
		return nil, 0, fmt.Errorf("replica %s of project %s: %w", l.Replica, l.Project, backend.ErrNoLog)
	case err != nil:
		return nil, 0, fmt.Errorf("read replica log: %w", err)
	}
	return lines, next, nil
}

// FollowLog writes what l gets after offset from; see backend.Logs.
func (d LogDir) FollowLog(ctx context.Context, l backend.Log, from int64, w io.Writer) error {
	path, ok := d.pathOf(l)
	if !ok {
		return backend.ErrNoLog
	}
	return followLog(ctx, path, from, followPoll, newEscapeWriter(w))
}

// pathOf is the file of l, unless a name in l could step out of d.
func (d LogDir) pathOf(l backend.Log) (string, bool) {
	if d == "" || !pathName(l.Team) || !pathName(l.Project) || !pathName(l.Replica) {
		return "", false
	}
	return LogPath(string(d), l.Team, l.Project, l.Replica), true
}

// ReplicaLogs lists the logs kept for project's replicas; see backend.Logs.
func (b *Backend) ReplicaLogs(team, project string) ([]backend.Log, error) {
	return LogDir(b.cfg.LogDir).ReplicaLogs(team, project)
}

// TailLog returns the last n lines of l; see backend.Logs.
func (b *Backend) TailLog(l backend.Log, n int) ([]string, int64, error) {
	return LogDir(b.cfg.LogDir).TailLog(l, n)
}

// FollowLog writes what l gets after offset from; see backend.Logs.
func (b *Backend) FollowLog(ctx context.Context, l backend.Log, from int64, w io.Writer) error {
	return LogDir(b.cfg.LogDir).FollowLog(ctx, l, from, w)
}

// logFile is one replica's current log file.
type logFile struct {
	log  backend.Log
	path string
	mod  time.Time
}

// findLogs returns the logs of project's replicas under dir, the most
// recently written first: those kept for team, or for any team when team is
// "".
func findLogs(dir, team, project string) ([]logFile, error) {
	teams := []string{team}
	if team == "" {
		entries, err := os.ReadDir(dir)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("list replica logs: %w", err)
		}
		teams = teams[:0]
		for _, e := range entries {
			if e.IsDir() {
				teams = append(teams, e.Name())
			}
		}
	}
	var logs []logFile
	for _, t := range teams {
		projectDir := filepath.Join(dir, t, project)
		entries, err := os.ReadDir(projectDir)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list replica logs: %w", err)
		}
		for _, e := range entries {
			id, ok := strings.CutSuffix(e.Name(), logSuffix)
			if !ok || !e.Type().IsRegular() {
				continue
			}
			info, err := e.Info()
			if err != nil {
				continue // removed meanwhile
			}
			logs = append(logs, logFile{
				log:  backend.Log{Team: t, Project: project, Replica: id},
				path: filepath.Join(projectDir, e.Name()),
				mod:  info.ModTime(),
			})
		}
	}
	slices.SortFunc(logs, func(a, b logFile) int {
		if c := b.mod.Compare(a.mod); c != 0 {
			return c
		}
		return strings.Compare(a.path, b.path)
	})
	return logs, nil
}

// tailChunk is how much tailLog reads from the end of each generation.
const tailChunk = 256 << 10

// tailLog returns the last n lines of the log at path, reaching into older
// generations (path.1, path.2, ...) when the current file has fewer. Lines
// are valid UTF-8 and at most backend.MaxLogLineBytes long. A log that does
// not exist is os.ErrNotExist.
func tailLog(path string, n int) ([]string, error) {
	var lines []string
	for gen := 0; len(lines) < n; gen++ {
		name := path
		if gen > 0 {
			name = generation(path, gen)
		}
		chunk, whole, err := readTail(name, tailChunk)
		if errors.Is(err, os.ErrNotExist) {
			if gen == 0 {
				return nil, err
			}
			break
		}
		if err != nil {
			return nil, err
		}
		got := splitLines(chunk, !whole)
		if len(got) > n-len(lines) {
			got = got[len(got)-(n-len(lines)):]
		}
		lines = append(got, lines...)
		if !whole {
			break // older generations are older than what was skipped here
		}
	}
	return lines, nil
}

// readTail returns the last limit bytes of the file and whether that is all of it.
func readTail(name string, limit int64) (chunk []byte, whole bool, err error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, false, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, false, err
	}
	off := max(st.Size()-limit, 0)
	chunk, err = io.ReadAll(io.NewSectionReader(f, off, st.Size()-off))
	return chunk, off == 0, err
}

// splitLines splits b into display lines; with cut, the first line is a
// fragment and is dropped. \r ends a line too, so progress bars show their
// latest state rather than one very long line.
func splitLines(b []byte, cut bool) []string {
	if cut {
		i := bytes.IndexAny(b, "\r\n")
		if i < 0 {
			return nil
		}
		b = b[i+1:]
	}
	// Blank lines (and the empty piece between \r and \n) are dropped.
	parts := bytes.FieldsFunc(b, func(r rune) bool { return r == '\n' || r == '\r' })
	out := make([]string, 0, len(parts))
	for _, p := range parts {
		if len(p) > backend.MaxLogLineBytes {
			p = p[:backend.MaxLogLineBytes]
		}
		out = append(out, escapeLine(string(p)))
	}
	return out
}

// followLog writes to w what is appended to the log at path after its first
// `from` bytes, until ctx ends or a write to w fails. It checks for growth
// every poll; when the file is rotated (it shrinks or is replaced), it goes on
// from the start of the new file. It returns nil when ctx ends.
func followLog(ctx context.Context, path string, from int64, poll time.Duration, w io.Writer) error {
	var (
		f    *os.File
		prev os.FileInfo
	)
	defer func() {
		if f != nil {
			f.Close()
		}
	}()
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		st, err := os.Stat(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			// Between a rotation's rename and the new file: wait.
		case err != nil:
			return err
		default:
			if f != nil && (!os.SameFile(prev, st) || st.Size() < from) {
				// Rotated: what was written before the rename is still
				// readable through the open file.
				if _, err := copyFrom(w, f, from); err != nil {
					return err
				}
				f.Close()
				f, from = nil, 0
			}
			if f == nil {
				if f, err = os.Open(path); err != nil {
					return err
				}
			}
			prev = st
			n, err := copyFrom(w, f, from)
			from += n
			if err != nil {
				return err
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// copyFrom writes what f holds past offset from and returns how much.
func copyFrom(w io.Writer, f *os.File, from int64) (int64, error) {
	st, err := f.Stat()
	if err != nil || st.Size() <= from {
		return 0, err
	}
	return io.Copy(w, io.NewSectionReader(f, from, st.Size()-from))
}

// logSize returns the current size of the log at path, where a follow that
// shows only new output starts.
func logSize(path string) (int64, error) {
	st, err := os.Stat(path)
	if err != nil {
		return 0, err
	}
	return st.Size(), nil
}
