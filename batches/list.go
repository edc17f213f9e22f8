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

// BatchIDs returns the ids of the batches acc reaches, newest first (by
// creation, then id): GET /v1/batches pages them, then reads the page's
// batches (Batch), so that a listing holds no more records than a page.
func (m *Manager) BatchIDs(acc Access) []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	type entry struct {
		id string
		at int64
	}
	var out []entry
	for _, b := range m.batches {
		if acc.reachesBatch(b.Team, b.Project) {
			out = append(out, entry{b.ID, b.CreatedAt})
		}
	}
	for _, e := range m.ended {
		if acc.reachesBatch(e.Team, e.Project) {
			out = append(out, entry{e.ID, e.CreatedAt})
		}
	}
	slices.SortFunc(out, func(a, b entry) int { return newestFirst(a.at, b.at, a.id, b.id) })
	ids := make([]string, len(out))
	for i, e := range out {
		ids[i] = e.id
	}
	return ids
}

// newestFirst orders by creation time, latest first, and by id within a
// second, so that a listing pages the same way every time.
func newestFirst(at, bt int64, aid, bid string) int {
	return cmp.Or(cmp.Compare(bt, at), cmp.Compare(bid, aid))
}
