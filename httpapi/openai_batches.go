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

	"inferd/openai"
	"inferd/openai/batches"
	"inferd/store"
)

// BatchAPI keeps the files and batches of the OpenAI Batch API and runs
// the batches (openai/batches.Manager). Every id is the team's own: another
// team's is ErrNotFound, as one that does not exist.
type BatchAPI interface {
	PutFile(team, filename, purpose string, content io.Reader) (batches.File, error)
	File(team, id string) (batches.File, error)
	OpenContent(team, id string) (*os.File, batches.File, error)
	DeleteFile(team, id string) (batches.File, error)
	CreateBatch(team string, req batches.CreateRequest, resolve batches.Resolver) (batches.Batch, error)
	Batch(team, id string) (batches.Batch, error)
	CancelBatch(team, id string) (batches.Batch, error)
}

// batchRoutes adds the Batch API's routes to the route table.
func (a *api) batchRoutes(add func(method, path string, need store.Permission, h httprouter.Handle)) {
	add(http.MethodPost, "/v1/files", store.PermInfer, a.uploadFile)
	add(http.MethodGet, "/v1/files/:id", store.PermInfer, a.getFile)
	add(http.MethodDelete, "/v1/files/:id", store.PermInfer, a.deleteFile)
	add(http.MethodGet, "/v1/files/:id/content", store.PermInfer, a.fileContent)
	add(http.MethodPost, "/v1/batches", store.PermInfer, a.createBatch)
	add(http.MethodGet, "/v1/batches/:id", store.PermInfer, a.getBatch)
	add(http.MethodPost, "/v1/batches/:id/cancel", store.PermInfer, a.cancelBatch)
}

// batchError answers an error of the Batch API in OpenAI's shape.
func (a *api) batchError(w http.ResponseWriter, r *http.Request, err error, what string) {
	var ie *batches.InputError
	var be *batches.BudgetError
	switch {
	case errors.Is(err, batches.ErrNotFound):
		err = &oaiError{status: http.StatusNotFound, typ: openai.TypeInvalidRequest, code: "not_found", msg: "no such " + what}
	case errors.As(err, &ie):
		err = &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: ie.Param, msg: ie.Error()}
	case errors.Is(err, batches.ErrTooLarge):
		err = &oaiError{status: http.StatusRequestEntityTooLarge, typ: openai.TypeInvalidRequest, code: "file_too_large", msg: err.Error()}
	case errors.As(err, &be):
		err = &oaiError{status: http.StatusRequestEntityTooLarge, typ: openai.TypeInvalidRequest, code: "file_budget", msg: be.Error()}
	}
	a.openaiError(w, r, err)
}

// uploadFile handles POST /v1/files: a multipart form with purpose
// "batch" and the file (JSONL), streamed to disk within the file bounds.
func (a *api) uploadFile(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	if mt, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type")); mt != "multipart/form-data" {
		a.openaiError(w, r, badRequest("send the file as multipart/form-data with the fields purpose and file"))
		return
	}
	// The form around the file adds a little; the file itself is bounded
	// by the manager as it is written.
	r.Body = http.MaxBytesReader(w, r.Body, a.opts.BatchFileBytes+1<<20)
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
		if err != nil {
			a.discardUpload(key.TeamID, f.ID)
			a.batchError(w, r, uploadReadError(err), "file")
			return
		}
		switch part.FormName() {
		case "purpose":
			b, _ := io.ReadAll(io.LimitReader(part, 64))
			purpose = strings.TrimSpace(string(b))
		case "file":
			if f.ID != "" {
				a.discardUpload(key.TeamID, f.ID)
				a.openaiError(w, r, badRequest("send one file per request"))
				return
			}
			// The purpose may come after the file (the SDKs send the
			// fields in the caller's order): checked once the form is read.
			f, err = a.opts.Batches.PutFile(key.TeamID, part.FileName(), batches.PurposeBatch, part)
			if err != nil {
				a.batchError(w, r, uploadReadError(err), "file")
				return
			}
		}
		part.Close()
	}
	switch {
	case f.ID == "":
		a.openaiError(w, r, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: "file", msg: "the form has no file field"})
	case purpose != batches.PurposeBatch:
		a.discardUpload(key.TeamID, f.ID)
		a.openaiError(w, r, &oaiError{status: http.StatusBadRequest, typ: openai.TypeInvalidRequest, param: "purpose",
			msg: fmt.Sprintf("purpose must be %q: inferd keeps files for the Batch API only", batches.PurposeBatch)})
	default:
		writeJSON(w, http.StatusOK, f)
	}
}

// uploadReadError names a body over its bound as too large.
func uploadReadError(err error) error {
	var tooLarge *http.MaxBytesError
	if errors.As(err, &tooLarge) {
		return fmt.Errorf("%w: the upload is larger than %d bytes", batches.ErrTooLarge, tooLarge.Limit)
	}
	return err
}

// discardUpload removes a file of a refused upload.
func (a *api) discardUpload(team, id string) {
	if id == "" {
		return
	}
	if _, err := a.opts.Batches.DeleteFile(team, id); err != nil {
		a.log.Warn().Err(err).Str("file", id).Msg("removing a refused upload failed")
	}
}

// getFile handles GET /v1/files/:id.
func (a *api) getFile(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	f, err := a.opts.Batches.File(key.TeamID, ps.ByName("id"))
	if err != nil {
		a.batchError(w, r, err, "file")
		return
	}
	writeJSON(w, http.StatusOK, f)
}

// deleteFile handles DELETE /v1/files/:id.
func (a *api) deleteFile(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	f, err := a.opts.Batches.DeleteFile(key.TeamID, ps.ByName("id"))
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
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	c, f, err := a.opts.Batches.OpenContent(key.TeamID, ps.ByName("id"))
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

// createBatch handles POST /v1/batches: the input file's lines must name
// one model the key may call.
func (a *api) createBatch(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	body, err := a.readBody(w, r, a.opts.MaxBodyBytes)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	var req batches.CreateRequest
	if err := json.Unmarshal(body, &req); err != nil {
		a.openaiError(w, r, malformedJSON(err))
		return
	}
	projects, err := a.callableProjects(key)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	b, err := a.opts.Batches.CreateBatch(key.TeamID, req, func(model string) (store.Project, bool) {
		return store.ResolveModel(projects, model)
	})
	if err != nil {
		a.batchError(w, r, err, "file")
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// getBatch handles GET /v1/batches/:id.
func (a *api) getBatch(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	b, err := a.opts.Batches.Batch(key.TeamID, ps.ByName("id"))
	if err != nil {
		a.batchError(w, r, err, "batch")
		return
	}
	writeJSON(w, http.StatusOK, b)
}

// cancelBatch handles POST /v1/batches/:id/cancel.
func (a *api) cancelBatch(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	b, err := a.opts.Batches.CancelBatch(key.TeamID, ps.ByName("id"))
	if err != nil {
		a.batchError(w, r, err, "batch")
		return
	}
	writeJSON(w, http.StatusOK, b)
}
