package httpapi

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"inferd/store"
)

// Fuzz targets for every request body the API decodes. Each checks the same
// promise: whatever the bytes, the handler does not panic and answers either
// a valid result or a clear error in the endpoint's own error shape, never an
// internal error. Seed corpora live in testdata/fuzz/<target>; `make fuzz`
// runs each target for a while, `make test` for a few seconds.

// fuzzDepth is the modelInputs depth limit the fuzzed API runs with.
const fuzzDepth = 8

// newFuzzEnv is newEnv without the log buffer, which would grow for as long
// as the fuzzer runs, and with waits short enough not to stall it.
func newFuzzEnv(t testing.TB) *testEnv {
	env := newEnv(t, Options{})
	env.h = New(Options{
		StartWait: time.Millisecond, LongPollWait: time.Millisecond,
		MaxBodyBytes: 64 << 10, APIVersion: "inferd/fuzz", Log: zerolog.Nop(),
		Limits: Limits{MaxInputDepth: fuzzDepth},
	}, env.store, env.sched)
	env.sched.instant = true
	return env
}

// checkInferenceAnswer asserts the inference contract on any answer: HTTP 200,
// the full envelope, and a message that is success, a pending state, or a
// clear "error: ..." that is not an internal one.
func checkInferenceAnswer(t *testing.T, m map[string]any) string {
	t.Helper()
	msg := m["message"].(string)
	switch {
	case msg == "success", msg == "queued", msg == "running", msg == "booting":
	case strings.HasPrefix(msg, "error: internal"):
		t.Fatalf("input caused an internal error: %q", msg)
	case strings.HasPrefix(msg, "error: ") && len(msg) > len("error: "):
	default:
		t.Fatalf("message %q is neither a result nor a clear error", msg)
	}
	return msg
}

func FuzzStartBody(f *testing.F) {
	for _, s := range []string{
		`{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {"prompt": "hi"}}`,
		`{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "startOnly": true, "modelInputs": {"a": [1, {"b": null}]}}`,
		`{"id": "x", "created": 1, "apiKey": "` + keyOther + `", "modelKey": "mk-hidden", "modelInputs": {}}`,
		`{"apiKey": "` + keyAcme + `", "modelKey": "mk-hidden", "modelInputs": {}}`,
		`{"apiKey": "\u0069k_acme_secret", "modelKey": "mk-echo", "modelInputs": {"s": "[[[\""}}`,
		`{"apiKey": 1, "modelKey": [], "modelInputs": "x", "startOnly": "yes"}`,
		`[{"apiKey": "x"}]`, `{"apiKey": `, ``, `null`,
	} {
		f.Add([]byte(s))
	}
	env := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(env.h, http.MethodPost, "/start/v4", string(body))
		m := inferenceReply(t, rec)
		if checkInferenceAnswer(t, m) != "success" {
			return
		}
		// Accepted: the model got one JSON object within the depth limit,
		// and only a key of the project's team could start it.
		var req struct {
			APIKey, ModelKey string
			ModelInputs      json.RawMessage
		}
		if err := json.Unmarshal(body, &req); err != nil {
			t.Fatalf("a body that is not JSON was accepted: %v", err)
		}
		owner := map[string]string{"mk-echo": "acme", "mk-zeta": "acme", "mk-hidden": "other"}[req.ModelKey]
		team := map[string]string{keyAcme: "acme", keyOther: "other", keyAdmin: owner}[req.APIKey]
		if owner == "" || team != owner {
			t.Fatalf("apiKey %q started modelKey %q", req.APIKey, req.ModelKey)
		}
		if !json.Valid(req.ModelInputs) || req.ModelInputs[0] != '{' || jsonDepthExceeds(req.ModelInputs, fuzzDepth) {
			t.Fatalf("accepted modelInputs %s", req.ModelInputs)
		}
	})
}

func FuzzCheckBody(f *testing.F) {
	for _, s := range []string{
		`{"apiKey": "` + keyAcme + `", "callID": "c-done"}`,
		`{"apiKey": "` + keyAcme + `", "callID": "c-pending", "longPoll": true}`,
		`{"apiKey": "` + keyOther + `", "callID": "c-done", "longPoll": false}`,
		`{"apiKey": "` + keyAdmin + `", "callID": "c-failed"}`,
		`{"apiKey": "` + keyRevoked + `", "callID": "c-done"}`,
		`{"apiKey": "` + keyAcme + `", "callID": 7, "longPoll": "true"}`,
		`{"apiKey": "` + keyAcme + `"}`, `"x"`, `{`, ``,
	} {
		f.Add([]byte(s))
	}
	env := newFuzzEnv(f)
	env.sched.add(store.Call{ID: "c-done", TeamID: "acme", State: store.CallSucceeded, Outputs: json.RawMessage(`{"ok":1}`)})
	env.sched.add(store.Call{ID: "c-pending", TeamID: "acme", State: store.CallRunning})
	env.sched.add(store.Call{ID: "c-failed", TeamID: "acme", State: store.CallFailed, Message: "error: model crashed"})
	f.Fuzz(func(t *testing.T, body []byte) {
		rec := serve(env.h, http.MethodPost, "/check/v4", string(body))
		m := inferenceReply(t, rec)
		msg := checkInferenceAnswer(t, m)
		if msg == "error: model crashed" || !strings.HasPrefix(msg, "error: ") {
			// A call was shown: only to a key of its team.
			var req struct{ APIKey string }
			if err := json.Unmarshal(body, &req); err != nil || (req.APIKey != keyAcme && req.APIKey != keyAdmin) {
				t.Fatalf("call shown to apiKey %q (%v)", req.APIKey, err)
			}
		}
	})
}

func FuzzProjectPutBody(f *testing.F) {
	for _, s := range []string{
		`{"minReplicas": 1}`,
		`{"maxReplicas": 5, "inferenceTimeout": 60, "idleTimeout": 0}`,
		`{"minReplicas": 4, "maxReplicas": 2}`,
		`{"maxReplicas": 5.0}`, `{"maxReplicas": "5"}`, `{"maxReplicas": -1}`,
		`{"maxReplicas": 99999999999999999999}`, `{"id": "x"}`, `{"teamId": "other"}`,
		`{"bogus": 1}`, `{}`, `[]`, `{"minReplicas": 1, "minReplicas": 2}`, ``,
	} {
		f.Add([]byte(s))
	}
	env := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		before := env.store.project("echo")
		rec := serve(env.h, http.MethodPut, "/v1/projects/echo", string(body), "X-Service-API-Key", keyAcme)
		after := env.store.project("echo")
		switch rec.Code {
		case http.StatusOK:
			if err := after.Validate(); err != nil {
				t.Fatalf("accepted an update that leaves the project invalid: %v", err)
			}
			if got := decode[projectView](t, rec); got != viewProject(after) {
				t.Fatalf("answered %+v, stored %+v", got, viewProject(after))
			}
			if after.ID != "echo" || after.TeamID != "acme" || after.Model.KeyHash != before.Model.KeyHash {
				t.Fatalf("an update changed more than the four attributes: %+v", after)
			}
		case http.StatusBadRequest:
			apiErrorReply(t, rec, rec.Code, codeBadRequest)
			if viewProject(after) != viewProject(before) {
				t.Fatalf("a refused update changed the project: %+v → %+v", before, after)
			}
		case http.StatusRequestEntityTooLarge:
			apiErrorReply(t, rec, rec.Code, codeTooLarge)
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body)
		}
	})
}
