package httpapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"os"
	"strconv"
	"strings"

	"github.com/julienschmidt/httprouter"

	"inferd/batches"
	"inferd/openai"
	"inferd/store"
)

// BatchAPI keeps the files and batches of the OpenAI Batch API and runs
// the batches (openai/batches.Manager). What a key may reach is its
// batches.Access: its team's, within its project allowlist (every team's
// for an admin key); anything else is ErrNotFound, as what does not exist.
type BatchAPI interface {
	PutFile(acc batches.Access, filename, purpose string, content io.Reader) (batches.File, error)
	File(acc batches.Access, id string) (batches.File, error)
	OpenContent(acc batches.Access, id string) (*os.File, batches.File, error)
	DeleteFile(acc batches.Access, id string) (batches.File, error)
	CreateBatch(acc batches.Access, req batches.CreateRequest, resolve batches.Resolver) (batches.Batch, error)
	Batch(acc batches.Access, id string) (batches.Batch, error)
	CancelBatch(acc batches.Access, id string) (batches.Batch, error)
	// Files and BatchEntries list what acc reaches, newest first.
	Files(acc batches.Access, purpose string) []batches.File
	BatchEntries(acc batches.Access) []batches.BatchEntry
}

// batchRoutes adds the Batch API's routes to the route table. They are
// listed whether or not a BatchAPI is set (the daemon always sets one), so
// that the table is every route the daemon serves; without one they answer
// 404 to a key that may use them.
func (a *api) batchRoutes(add func(method, path string, need store.Permission, h httprouter.Handle)) {
	add(http.MethodPost, "/v1/files", store.PermInfer, a.uploadFile)
	add(http.MethodGet, "/v1/files", store.PermInfer, a.listFiles)
	add(http.MethodGet, "/v1/files/:id", store.PermInfer, a.getFile)
	add(http.MethodDelete, "/v1/files/:id", store.PermInfer, a.deleteFile)
	add(http.MethodGet, "/v1/files/:id/content", store.PermInfer, a.fileContent)
	add(http.MethodPost, "/v1/batches", store.PermInfer, a.createBatch)
	add(http.MethodGet, "/v1/batches", store.PermInfer, a.listBatches)
	add(http.MethodGet, "/v1/batches/:id", store.PermInfer, a.getBatch)
	add(http.MethodPost, "/v1/batches/:id/cancel", store.PermInfer, a.cancelBatch)
}

var errNoBatchAPI = &oaiError{status: http.StatusNotFound, typ: openai.TypeInvalidRequest, code: "not_found",
	msg: "this server does not serve the Batch API"}

// batchKey authenticates a request of the Batch API (scope infer) and
// returns its key and what the key reaches of files and batches; false
// once it has answered a refusal.
func (a *api) batchKey(w http.ResponseWriter, r *http.Request) (store.APIKey, batches.Access, bool) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err == nil && a.opts.Batches == nil {
		err = errNoBatchAPI
	}
	if err != nil {
		a.openaiError(w, r, err)
		return store.APIKey{}, batches.Access{}, false
	}
	return key, batches.Access{Team: key.TeamID, Projects: key.Projects, Admin: key.Scope == store.ScopeAdmin}, true
}

// batchError answers an error of the Batch API in OpenAI's shape.
func (a *api) batchError(w http.ResponseWriter, r *http.Request, err error, what string) {
	var ie *batches.InputError
	var be *batches.BudgetError
	var le *batches.LimitError
	switch {
	case errors.Is(err, batches.ErrNotFound):
		err = &oaiError{status: http.StatusNotFound, typ: openai.TypeInvalidRequest, code: "not_found", msg: "no such " + what}
	case errors.As(err, &ie):
		err = &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: ie.Param, msg: ie.Error()}
	case errors.Is(err, batches.ErrTooLarge):
		err = &oaiError{status: http.StatusRequestEntityTooLarge, typ: openai.TypeInvalidRequest, code: "file_too_large", msg: err.Error()}
	case errors.As(err, &be):
		err = &oaiError{status: http.StatusRequestEntityTooLarge, typ: openai.TypeInvalidRequest, code: "file_budget", msg: be.Error()}
	case errors.As(err, &le):
		a.refused(le.Budget)
		oe := &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, code: le.Code, msg: le.Msg}
		if le.Retry { // a budget that frees itself: retry after a while
			oe.status, oe.typ, oe.retryAfter = http.StatusTooManyRequests, openai.TypeRateLimit, "1"
		}
		err = oe
	}
	a.openaiError(w, r, err)
}

// uploadFormBytes is what an upload's form may add to its file: the
// purpose field and the parts' headers.
const uploadFormBytes = 1 << 20

// uploadBufferBytes is what an upload holds in memory while it streams to
// disk (the multipart reader's buffer, 4 KiB, and the copy's, 32 KiB,
// rounded up): what it counts in the body budgets (limits.bodyBytes and
// bodyBytesPerSource) until it is read. Its bytes on disk are bounded by
// the file and team caps as they are written (batches.Manager.PutFile),
// and its time by limits.bodyReadTimeout, as every body's.
const uploadBufferBytes = 64 << 10

// uploadFile handles POST /v1/files: a multipart form with purpose
// "batch" and the file (JSONL), streamed to disk within the file bounds.
func (a *api) uploadFile(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	_, acc, ok := a.batchKey(w, r)
	if !ok {
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "multipart/form-data" {
		a.openaiError(w, r, badRequest("send the file as multipart/form-data with the fields purpose and file"))
		return
	}
	limit := a.opts.BatchFileBytes + uploadFormBytes
	if r.ContentLength > limit { // refused before a byte is read or written
		w.Header().Set("Connection", "close")
		a.batchError(w, r, a.uploadError(w, &http.MaxBytesError{Limit: limit}), "file")
		return
	}
	acct := a.bodyAccount(r)
	defer acct.close()
	if err := acct.grow(uploadBufferBytes); err != nil {
		a.openaiError(w, r, a.bodyRefusal(w, err))
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, limit)
	mr, err := r.MultipartReader()
	if err != nil {
		a.openaiError(w, r, badRequest("malformed multipart form: %v", err))
		return
	}
	var f batches.File
	purpose := ""
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			break
		}
		if err != nil { // the form's: NextPart reads only the body
			a.discardUpload(acc, f.ID)
			a.batchError(w, r, a.uploadError(w, &uploadReadError{err}), "file")
			return
		}
		switch part.FormName() {
		case "purpose":
			b, err := io.ReadAll(io.LimitReader(uploadPart{part}, 64))
			if err != nil {
				a.discardUpload(acc, f.ID)
				a.batchError(w, r, a.uploadError(w, err), "file")
				return
			}
			purpose = strings.TrimSpace(string(b))
		case "file":
			if f.ID != "" {
				a.discardUpload(acc, f.ID)
				a.openaiError(w, r, badRequest("send one file per request"))
				return
			}
			// The purpose may come after the file (the SDKs send the
			// fields in the caller's order): checked once the form is read.
			f, err = a.opts.Batches.PutFile(acc, part.FileName(), batches.PurposeBatch, uploadPart{part})
			if err != nil {
				a.batchError(w, r, a.uploadError(w, err), "file")
				return
			}
		}
		part.Close()
	}
	switch {
	case f.ID == "":
		a.openaiError(w, r, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: "file", msg: "the form has no file field"})
	case purpose != batches.PurposeBatch:
		a.discardUpload(acc, f.ID)
		a.openaiError(w, r, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: "purpose",
			msg: fmt.Sprintf("purpose must be %q: inferd keeps files for the Batch API only", batches.PurposeBatch)})
	default:
		writeJSON(w, http.StatusOK, f)
	}
}

// uploadPart is a part of an upload's form: its read errors are the
// client's (a body cut short, too slow, too large, malformed), told apart
// from the disk's as the Manager writes the file.
type uploadPart struct{ io.Reader }

func (p uploadPart) Read(b []byte) (int, error) {
	n, err := p.Reader.Read(b)
	if err != nil && err != io.EOF {
		err = &uploadReadError{err}
	}
	return n, err
}

type uploadReadError struct{ err error }

func (e *uploadReadError) Error() string { return e.err.Error() }
func (e *uploadReadError) Unwrap() error { return e.err }

// uploadError is what the caller is told of an upload that failed: too
// large (the file's bound or the form's), too slow (limits.bodyReadTimeout,
// counted as that budget's refusal), cut short or malformed; any other
// error (the Manager's, the disk's) as it is.
func (a *api) uploadError(w http.ResponseWriter, err error) error {
	var tooLarge *http.MaxBytesError
	var readErr *uploadReadError
	switch {
	case errors.As(err, &tooLarge):
		return fmt.Errorf("%w: the upload is larger than %d bytes", batches.ErrTooLarge, tooLarge.Limit)
	case errors.Is(err, os.ErrDeadlineExceeded):
		return a.bodyRefusal(w, errBodyDeadline)
	case errors.As(err, &readErr):
		return badRequest("could not read the upload: %v", err)
	}
	return err
}

// discardUpload removes a file of a refused upload.
func (a *api) discardUpload(acc batches.Access, id string) {
	if id == "" {
		return
	}
	if _, err := a.opts.Batches.DeleteFile(acc, id); err != nil {
		a.log.Warn().Err(err).Str("file", id).Msg("removing a refused upload failed")
	}
}

// getFile handles GET /v1/files/:id.
func (a *api) getFile(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	_, acc, ok := a.batchKey(w, r)
	if !ok || a.batchElsewhere(w, r, ps.ByName("id"), nil, batchForwardWait) {
		return
	}
	f, err := a.opts.Batches.File(acc, ps.ByName("id"))
	if err != nil {
		a.batchError(w, r, err, "file")
		return
	}
	writeJSON(w, http.StatusOK, f)
}

// deleteFile handles DELETE /v1/files/:id.
func (a *api) deleteFile(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	_, acc, ok := a.batchKey(w, r)
	if !ok || a.batchElsewhere(w, r, ps.ByName("id"), nil, batchForwardWait) {
		return
	}
	f, err := a.opts.Batches.DeleteFile(acc, ps.ByName("id"))
	if err != nil {
		a.batchError(w, r, err, "file")
		return
	}
	writeJSON(w, http.StatusOK, struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Deleted bool   `json:"deleted"`
	}{f.ID, "file", true})
}

// fileContent handles GET /v1/files/:id/content: the file as stored
// (JSONL), streamed from disk.
func (a *api) fileContent(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	_, acc, ok := a.batchKey(w, r)
	if !ok || a.batchElsewhere(w, r, ps.ByName("id"), nil, batchContentWait) {
		return
	}
	c, f, err := a.opts.Batches.OpenContent(acc, ps.ByName("id"))
	if err != nil {
		a.batchError(w, r, err, "file")
		return
	}
	defer c.Close()
	w.Header().Set("Content-Type", "application/jsonl")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
	w.WriteHeader(http.StatusOK)
	_, _ = io.Copy(w, c) // a failed copy means the client is gone
}

// createBodyBytes bounds POST /v1/batches' body: ids and metadata, whose
// most (16 pairs of 64 and 512 characters) is 37 KiB as UTF-8 and 55 KiB
// written as JSON escapes. A larger body is refused 413 before it is read
// (by its announced length) or as it passes the bound, not read whole into
// memory (issue 41: 100 creates of 9.4 MiB metadata peaked at 400 MiB
// with maxBodyBytes as the bound).
const createBodyBytes = 256 << 10

// createBatch handles POST /v1/batches: the input file's lines must name
// one model the key may call.
func (a *api) createBatch(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, acc, ok := a.batchKey(w, r)
	if !ok {
		return
	}
	body, err := a.readBody(w, r, min(a.opts.MaxBodyBytes, createBodyBytes))
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	var req batches.CreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		a.openaiError(w, r, malformedJSON(err))
		return
	}
	// The batch is made where its input file is, which reads it.
	if a.batchElsewhere(w, r, req.InputFileID, body, batchForwardWait) {
		return
	}
	// The lines' model resolves as a request's would (the call path's
	// model names); a store that fails the lookup is that error, not a
	// model that does not exist.
	var lookupErr error
	b, err := a.opts.Batches.CreateBatch(acc, req, func(model string) (store.Project, bool) {
		p, err := a.pipe.Model(key, model)
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			lookupErr = err
		}
		return p, err == nil
	})
	switch {
	case lookupErr != nil:
		a.openaiError(w, r, lookupErr)
		return
	case err != nil:
		a.batchError(w, r, err, "file")
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// getBatch handles GET /v1/batches/:id.
func (a *api) getBatch(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	_, acc, ok := a.batchKey(w, r)
	if !ok || a.batchElsewhere(w, r, ps.ByName("id"), nil, batchForwardWait) {
		return
	}
	b, err := a.opts.Batches.Batch(acc, ps.ByName("id"))
	if err != nil {
		a.batchError(w, r, err, "batch")
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// cancelBatch handles POST /v1/batches/:id/cancel.
func (a *api) cancelBatch(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	_, acc, ok := a.batchKey(w, r)
	if !ok || a.batchElsewhere(w, r, ps.ByName("id"), nil, batchForwardWait) {
		return
	}
	b, err := a.opts.Batches.CancelBatch(acc, ps.ByName("id"))
	if err != nil {
		a.batchError(w, r, err, "batch")
		return
	}
	writeJSON(w, http.StatusOK, b)
}
