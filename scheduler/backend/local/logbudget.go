package local

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// A project's replica logs, every replica's and every generation, stay
// under one byte budget (LogMaxBytesPerProject). Rotation alone bounds one
// replica's files, but every boot is a new replica id with files of its own:
// a model that crash-loops while flooding its log would otherwise fill the
// disk. The budget counts what is on disk, so it holds across restarts of
// the daemon; when a project goes over, its oldest files go first, and the
// file a live replica writes is never removed (the writer rotates it when
// nothing else is left to remove).

// logBudgets holds the budget of each project's log directory.
type logBudgets struct {
	max int64

	mu   sync.Mutex
	dirs map[string]*logBudget
}

func newLogBudgets(max int64) *logBudgets {
	return &logBudgets{max: max, dirs: map[string]*logBudget{}}
}

// of returns the budget of the project whose logs are in dir.
func (bs *logBudgets) of(dir string) *logBudget {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	lb, ok := bs.dirs[dir]
	if !ok {
		lb = &logBudget{dir: dir, max: bs.max, total: -1, open: map[string]int{}}
		bs.dirs[dir] = lb
	}
	return lb
}

// logBudget is one project's.
type logBudget struct {
	dir string
	max int64

	mu    sync.Mutex
	total int64          // bytes on disk as last counted plus written since; -1 = count first
	open  map[string]int // files live replicas write to: never removed
}

// attach registers path as written by a live replica, and trims the
// project's logs (what earlier runs left counts too).
func (lb *logBudget) attach(path string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.open[path]++
	lb.trim()
}

// detach ends attach, and trims once more: the replica's last output is in.
func (lb *logBudget) detach(path string) {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.open[path]--; lb.open[path] <= 0 {
		delete(lb.open, path)
	}
	lb.trim()
}

// wrote counts n bytes written, trimming when over the budget. It returns
// whether the project is still over it, which only the files live
// replicas write can make it: then the writer rotates its own file and
// calls trimmed.
func (lb *logBudget) wrote(n int64) bool {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	if lb.total >= 0 {
		lb.total += n
		if lb.total <= lb.max {
			return false
		}
	}
	return lb.trim()
}

// trimmed trims after a writer rotated its file.
func (lb *logBudget) trimmed() {
	lb.mu.Lock()
	defer lb.mu.Unlock()
	lb.trim()
}

// trim counts the project's log files and removes the oldest until they
// fit, never a file in open. It returns whether they still do not fit.
// Callers hold mu.
func (lb *logBudget) trim() bool {
	entries, err := os.ReadDir(lb.dir)
	if err != nil {
		lb.total = -1 // count again next time
		return false
	}
	type file struct {
		path string
		size int64
		mod  time.Time
	}
	var files []file
	var total int64
	for _, e := range entries {
		if !e.Type().IsRegular() || !isLogFile(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		total += info.Size()
		files = append(files, file{filepath.Join(lb.dir, e.Name()), info.Size(), info.ModTime()})
	}
	slices.SortFunc(files, func(a, b file) int {
		if c := a.mod.Compare(b.mod); c != 0 {
			return c
		}
		return strings.Compare(b.path, a.path) // .log.3 before .log.2 at the same time
	})
	for _, f := range files {
		if total <= lb.max {
			break
		}
		if lb.open[f.path] > 0 {
			continue
		}
		if err := os.Remove(f.path); err == nil || errors.Is(err, os.ErrNotExist) {
			total -= f.size
		}
	}
	lb.total = total
	return total > lb.max
}

// isLogFile reports whether name is a replica log or one of its generations
// (<replica>.log, <replica>.log.N).
func isLogFile(name string) bool {
	if strings.HasSuffix(name, logSuffix) {
		return true
	}
	i := strings.LastIndex(name, logSuffix+".")
	if i < 0 {
		return false
	}
	_, err := strconv.Atoi(name[i+len(logSuffix)+1:])
	return err == nil
}
