package batches

import (
	"context"
	"errors"
	"os"
	"time"

	"inferd/internal/durable"
)

// The Batch API's files and ended batches have a lifetime, as OpenAI's
// do: a file is removed Config.Retention after its creation (OpenAI's
// default for files of purpose batch: 30 days), unless a batch not yet
// ended reads it (then at the first sweep after that batch ends), and an
// ended batch's record Retention after it ended, with its output and
// error files (made then). So what the data dir, and the index of ended
// batches in memory, hold is bounded by what a team can make in that
// time.

// Defaults of Config's zero values.
const (
	// DefaultRetention is how long files and ended batches are kept.
	DefaultRetention = 30 * 24 * time.Hour
	// sweepEvery is how often what has expired is removed.
	sweepEvery = time.Hour
)

// sweepLoop removes what has expired now and every sweepEvery, on the
// Manager's clock, until ctx ends.
func (m *Manager) sweepLoop(ctx context.Context) {
	due := make(chan struct{}, 1)
	for {
		m.sweep()
		t := m.cfg.Clock.AfterFunc(sweepEvery, func() { due <- struct{}{} })
		select {
		case <-due:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// sweep removes the files and ended batches past their lifetime: from the
// index first, under the lock, then from disk (a removal that fails is
// logged; the next start finds the record and removes it then).
func (m *Manager) sweep() {
	now := m.now()
	expired := func(at int64) bool { return !time.Unix(at, 0).Add(m.cfg.Retention).After(now) }
	var paths []string
	m.mu.Lock()
	reading := map[string]bool{} // input files of batches not yet ended
	for _, b := range m.batches {
		reading[b.InputFileID] = true
	}
	for id, e := range m.ended {
		if expired(e.EndedAt) {
			delete(m.ended, id)
			paths = append(paths, m.batchPath(id))
		}
	}
	for id, f := range m.files {
		if expired(f.CreatedAt) && !reading[id] {
			delete(m.files, id)
			paths = append(paths, m.metaPath(id), m.contentPath(id))
		}
	}
	m.mu.Unlock()
	for _, p := range paths {
		if err := durable.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			m.cfg.Log.Warn().Err(err).Str("path", p).Msg("removing an expired Batch API file failed")
		}
	}
	if len(paths) > 0 {
		m.cfg.Log.Info().Int("removed", len(paths)).Msg("Batch API: expired files and batches removed")
	}
}
