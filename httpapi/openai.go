package httpapi

import (
	"errors"
	"net/http"
	"strings"

	"github.com/julienschmidt/httprouter"

	"inferd/httpapi/respond"
	"inferd/openai"
	"inferd/scheduler"
	"inferd/store"
)

// The OpenAI front door (docs/openai.md): projects of protocol openai are
// addressed by the "model" of /v1/chat/completions, /v1/completions and
// /v1/embeddings with an inferd key as the Bearer token; each request is
// an inferd call (openai_calls.go). GET /v1/models lists the models the
// key may call, and the Batch API runs a JSONL file of requests as calls
// (openai_batches.go). Every error is OpenAI's shape,
// {"error": {"message", "type", "param", "code"}}, with its status code.

// openaiRoutes adds the OpenAI routes to the route table (routes.go), each
// with the scope its handler asks of the Bearer key. Every path is static
// under /v1/ beside the project API's: httprouter refuses a parameter where
// another route has a static segment.
func (a *api) openaiRoutes(add func(method, path string, need store.Permission, h httprouter.Handle)) {
	for _, endpoint := range openai.Endpoints {
		add(http.MethodPost, endpoint, store.PermInfer, a.openaiCall(endpoint))
	}
	add(http.MethodGet, "/v1/models", store.PermInfer, a.openaiModels)
	// A model's name may hold "/" (an alias such as org/model): the rest
	// of the path is the name.
	add(http.MethodGet, "/v1/models/*model", store.PermInfer, a.openaiModel)
	add(http.MethodGet, "/v1/calls/:callID/response", store.PermInfer, a.openaiResponse)
	a.batchRoutes(add) // openai_batches.go
}

// oaiError is a refusal in OpenAI's shape. retryAfter adds the header (as
// it is: seconds, or a model's own value); final adds x-should-retry:
// false (openai.StatusError).
type oaiError struct {
	status     int
	typ, code  string
	param, msg string
	retryAfter string
	final      bool
}

func (e *oaiError) Error() string { return e.msg }

// The refusals of the OpenAI routes.
var (
	errOAIMissingKey = &oaiError{status: http.StatusUnauthorized, typ: openai.TypeInvalidRequest, code: "invalid_api_key",
		msg: "missing API key: send your inferd API key as Authorization: Bearer KEY"}
	errOAIInvalidKey = &oaiError{status: http.StatusUnauthorized, typ: openai.TypeInvalidRequest, code: "invalid_api_key",
		msg: "invalid API key"}
)

// errModelNotFound never names the model: another team's answers exactly
// as one that does not exist.
var errModelNotFound = &oaiError{status: http.StatusNotFound, typ: openai.TypeInvalidRequest, code: "model_not_found", param: "model",
	msg: "the model does not exist or you do not have access to it (GET /v1/models lists yours)"}

// openaiError answers err in OpenAI's shape: an *oaiError as it is, any
// other error with the status the project API gives it (respond.Classify, which
// also logs internal ones) and the OpenAI type of that status. Never a Go
// error's text: an internal failure names the request id to look up.
func (a *api) openaiError(w http.ResponseWriter, r *http.Request, err error) {
	var oe *oaiError
	if !errors.As(err, &oe) {
		status, code, msg, internal := respond.Classify(err, requestIDOf(w))
		if internal {
			a.log.Error().Err(err).Str("request_id", requestIDOf(w)).Str("method", r.Method).
				Str("path", truncate(r.URL.Path, 200)).Msg("request failed")
		}
		oe = &oaiError{status: status, typ: openai.TypeOfStatus(status), code: code, msg: msg}
		if status == http.StatusTooManyRequests || status == http.StatusServiceUnavailable {
			oe.retryAfter = "1"
		}
	}
	if oe.retryAfter != "" {
		w.Header().Set("Retry-After", oe.retryAfter)
	}
	if oe.final {
		w.Header().Set("X-Should-Retry", "false")
	}
	writeJSON(w, oe.status, openai.NewError(oe.typ, oe.code, oe.param, oe.msg))
}

// startRefused turns Scheduler.Start's refusal into OpenAI's: a full queue
// or a team at its quota is a 429 to retry; a project that can never run
// here, a 503 that says why; a store failure as respond.Classify says.
func startRefused(err error) error {
	switch {
	case errors.Is(err, scheduler.ErrQueueFull), errors.Is(err, scheduler.ErrTeamQuota):
		return &oaiError{status: http.StatusTooManyRequests, typ: openai.TypeRateLimit, code: "queue_full", msg: err.Error(), retryAfter: "1"}
	case errors.Is(err, scheduler.ErrNeedsGPUs):
		return &oaiError{status: http.StatusServiceUnavailable, typ: openai.TypeServer, code: "model_cannot_run", msg: err.Error()}
	case isStoreError(err) || errors.Is(err, store.ErrUnavailable):
		return err
	default:
		// The scheduler's other refusals are texts written for users.
		return &oaiError{status: http.StatusServiceUnavailable, typ: openai.TypeUnavailable, code: "unavailable", msg: err.Error(), retryAfter: "1"}
	}
}

// bearerSecret is the request's Authorization: Bearer key, as the OpenAI
// SDKs send their api_key.
func bearerSecret(r *http.Request) (string, error) {
	scheme, secret, _ := strings.Cut(r.Header.Get("Authorization"), " ")
	secret = strings.TrimSpace(secret)
	if !strings.EqualFold(scheme, "Bearer") || secret == "" {
		return "", errOAIMissingKey
	}
	return secret, nil
}

// bearerKey authenticates the request's Bearer key, which must allow p.
func (a *api) bearerKey(r *http.Request, p store.Permission) (store.APIKey, error) {
	secret, err := bearerSecret(r)
	if err != nil {
		return store.APIKey{}, err
	}
	key, err := a.authenticate(secret, errOAIInvalidKey)
	if err != nil {
		return store.APIKey{}, err
	}
	return key, requirePermission(key, p)
}

// modelList is GET /v1/models' answer.
type modelList struct {
	Object string       `json:"object"` // "list"
	Data   []modelEntry `json:"data"`
}

type modelEntry struct {
	ID      string `json:"id"`
	Object  string `json:"object"` // "model"
	Created int64  `json:"created"`
	OwnedBy string `json:"owned_by"` // the team
}

// openaiModel handles GET /v1/models/{model}: the model the name resolves
// to for the key, as a request's model would (pipeline.Pipeline.Model),
// named as asked; 404 model_not_found as for a request.
func (a *api) openaiModel(w http.ResponseWriter, r *http.Request, ps httprouter.Params) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	name := strings.TrimPrefix(ps.ByName("model"), "/")
	p, err := a.pipe.Model(key, name)
	switch {
	case errors.Is(err, store.ErrNotFound):
		a.openaiError(w, r, errModelNotFound)
	case err != nil:
		a.openaiError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, modelEntry{ID: name, Object: "model", Created: p.Created.Unix(), OwnedBy: p.TeamID})
	}
}

// openaiModels handles GET /v1/models: each name (project id, then its
// aliases) of the projects the key may call.
func (a *api) openaiModels(w http.ResponseWriter, r *http.Request, _ httprouter.Params) {
	key, err := a.bearerKey(r, store.PermInfer)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	projects, err := a.pipe.Models(key)
	if err != nil {
		a.openaiError(w, r, err)
		return
	}
	out := modelList{Object: "list", Data: []modelEntry{}}
	for _, p := range projects {
		for _, name := range p.ModelNames() {
			out.Data = append(out.Data, modelEntry{ID: name, Object: "model", Created: p.Created.Unix(), OwnedBy: p.TeamID})
		}
	}
	writeJSON(w, http.StatusOK, out)
}
