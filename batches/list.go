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
	slices.SortFunc(out, func(a, b File) int { return newestFirst(a.CreatedAt, b.CreatedAt, a.ID, b.ID) })
	return out
}

// Batches returns the batches acc reaches, newest first (by creation, then
// id), their counts as they stand: GET /v1/batches.
func (m *Manager) Batches(acc Access) []Batch {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []Batch
	for _, b := range m.batches {
		if acc.reachesBatch(b) {
			out = append(out, b.view())
		}
	}
	slices.SortFunc(out, func(a, b Batch) int { return newestFirst(a.CreatedAt, b.CreatedAt, a.ID, b.ID) })
	return out
}

// newestFirst orders by creation time, latest first, and by id within a
// second, so that a listing pages the same way every time.
func newestFirst(at, bt int64, aid, bid string) int {
	return cmp.Or(cmp.Compare(bt, at), cmp.Compare(bid, aid))
}
