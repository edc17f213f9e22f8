package httpapi

import (
	"net/http"
	"slices"
	"strconv"

	"github.com/julienschmidt/httprouter"

	"inferd/batches"
	"inferd/openai"
)

// The OpenAI routes that list (GET /v1/files, GET /v1/batches), paged as
// OpenAI pages them: newest first, limit items a page, after the id of the
// last item of the page before; the page says first_id, last_id and
// has_more.

// listPage is OpenAI's list object.
type listPage[T any] struct {
	Object  string  `json:"object"` // "list"
	Data    []T     `json:"data"`
	FirstID *string `json:"first_id"`
	LastID  *string `json:"last_id"`
	HasMore bool    `json:"has_more"`
}

// pageBounds are a list route's limits on limit.
type pageBounds struct{ def, max int }

var (
	filePages  = pageBounds{def: 10000, max: 10000} // OpenAI's for files
	batchPages = pageBounds{def: 20, max: 100}      // and for batches
)

// page cuts items (in list order) by the request's after and limit.
func page[T any](r *http.Request, items []T, id func(T) string, b pageBounds) (listPage[T], error) {
	q := r.URL.Query()
	limit := b.def
	if s := q.Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > b.max {
			return listPage[T]{}, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: "limit",
				msg: "limit must be a whole number from 1 to " + strconv.Itoa(b.max)}
		}
		limit = n
	}
	if after := q.Get("after"); after != "" {
		i := slices.IndexFunc(items, func(t T) bool { return id(t) == after })
		if i < 0 {
			return listPage[T]{}, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: "after",
				msg: "after names nothing in this list (deleted, or not yours)"}
		}
		items = items[i+1:]
	}
	p := listPage[T]{Object: "list", Data: items[:min(limit, len(items))], HasMore: len(items) > limit}
	if len(p.Data) > 0 {
		first, last := id(p.Data[0]), id(p.Data[len(p.Data)-1])
		p.FirstID, p.LastID = &first, &last
	}
	return p, nil
}

// listFiles handles GET /v1/files: the files the key reaches (its team's,
// within its project allowlist), newest first; purpose narrows them, order
// asc turns them round.
func (a *api) listFiles(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	_, acc, ok := a.batchKey(w, r)
	if !ok {
		return
	}
	files, err := a.allFiles(r, acc, r.URL.Query().Get("purpose"))
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	switch r.URL.Query().Get("order") {
	case "", "desc":
	case "asc":
		slices.Reverse(files)
	default:
		a.openaiError(w, r, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: "order",
			msg: `order must be "asc" or "desc"`})
		return
	}
	p, err := page(r, files, func(f batches.File) string { return f.ID }, filePages)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

// listBatches handles GET /v1/batches: the batches the key reaches, newest
// first. Their ids are paged, then only the page's batches are read (an
// ended batch's record is on disk, not in memory), each on the node that
// holds it; one removed meanwhile is left out.
func (a *api) listBatches(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	_, acc, ok := a.batchKey(w, r)
	if !ok {
		return
	}
	entries, err := a.allBatchEntries(r, acc)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	ids, err := page(r, entries, func(e batchEntry) string { return e.ID }, batchPages)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	data, err := a.readBatches(r, acc, ids.Data)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	p := listPage[batches.Batch]{Object: "list", Data: data, HasMore: ids.HasMore}
	if len(p.Data) > 0 {
		first, last := p.Data[0].ID, p.Data[len(p.Data)-1].ID
		p.FirstID, p.LastID = &first, &last
	}
	writeJSON(w, http.StatusOK, p)
}
