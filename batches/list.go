package batches

import (
	"cmp"
	"slices"
)

// Files returns the files acc reaches, newest first (by creation, then id),
// those of purpose only when it is set: GET /v1/files.
func (m *Manager) Files(acc Access, purpose string) []File {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []File
	for _, r := range m.files {
		if acc.reachesFile(r) && (purpose == "" || r.Purpose == purpose) {
			out = append(out, r.File)
		}
	}
	slices.SortFunc(out, func(a, b File) int { return NewestFirst(a.CreatedAt, b.CreatedAt, a.ID, b.ID) })
	return out
}

// BatchIDs returns the ids of the batches acc reaches, newest first (by
// creation, then id): GET /v1/batches pages them, then reads the page's
// batches (Batch), so that a listing holds no more records than a page.
func (m *Manager) BatchIDs(acc Access) []string {
	entries := m.BatchEntries(acc)
	ids := make([]string, len(entries))
	for i, e := range entries {
		ids[i] = e.ID
	}
	return ids
}

// BatchEntry is a batch as a listing orders it.
type BatchEntry struct {
	ID        string `json:"id"`
	CreatedAt int64  `json:"created_at"`
}

// BatchEntries is BatchIDs with each batch's creation time, so that the
// lists of several nodes merge in one order (NewestFirst).
func (m *Manager) BatchEntries(acc Access) []BatchEntry {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []BatchEntry
	for _, b := range m.batches {
		if acc.reachesBatch(b.Team, b.Project) {
			out = append(out, BatchEntry{b.ID, b.CreatedAt})
		}
	}
	for _, e := range m.ended {
		if acc.reachesBatch(e.Team, e.Project) {
			out = append(out, BatchEntry{e.ID, e.CreatedAt})
		}
	}
	slices.SortFunc(out, func(a, b BatchEntry) int { return NewestFirst(a.CreatedAt, b.CreatedAt, a.ID, b.ID) })
	return out
}

// NewestFirst orders by creation time, latest first, and by id within a
// second, so that a listing pages the same way every time.
func NewestFirst(at, bt int64, aid, bid string) int {
	return cmp.Or(cmp.Compare(bt, at), cmp.Compare(bid, aid))
}
