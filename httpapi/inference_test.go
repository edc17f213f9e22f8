package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"

	"inferd/store"
)

func TestInferenceErrorMessages(t *testing.T) {
	queueFull := fmt.Errorf("queue full (%d calls waiting); retry later", 1000)
	tests := []struct {
		name      string
		path      string
		body      string
		submitErr error
		authErr   error
		want      string // exact message, or a prefix when it ends in "*"
	}{
		{"empty body", "/start/v4", "", nil, nil, "error: request body is empty; send a JSON object"},
		{"blank body", "/check/v4", " \n\t", nil, nil, "error: request body is empty; send a JSON object"},
		{"malformed JSON", "/start/v4", `{"apiKey": `, nil, nil, "error: malformed JSON: *"},
		{"malformed JSON trailing garbage", "/start/v4", `{"apiKey": "x"} x`, nil, nil, "error: malformed JSON: *"},
		{"malformed non-object", "/check/v4", `[1,`, nil, nil, "error: malformed JSON: *"},
		{"array body", "/start/v4", `[1]`, nil, nil, "error: request body must be a JSON object"},
		{"string body", "/check/v4", `"hi"`, nil, nil, "error: request body must be a JSON object"},
		{"null body", "/start/v4", `null`, nil, nil, "error: request body must be a JSON object"},
		{"missing apiKey", "/start/v4", `{"modelKey": "mk-echo", "modelInputs": {}}`, nil, nil, "error: missing apiKey"},
		{"empty apiKey", "/check/v4", `{"apiKey": "", "callID": "c"}`, nil, nil, "error: missing apiKey"},
		{"apiKey not a string", "/start/v4", `{"apiKey": 5, "modelKey": "mk-echo", "modelInputs": {}}`, nil, nil, "error: apiKey must be a string"},
		{"modelKey not a string", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": true, "modelInputs": {}}`, nil, nil, "error: modelKey must be a string"},
		{"missing modelKey", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelInputs": {}}`, nil, nil, "error: missing modelKey"},
		{"missing modelInputs", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo"}`, nil, nil, "error: missing modelInputs; send a JSON object"},
		{"null modelInputs", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": null}`, nil, nil, "error: missing modelInputs; send a JSON object"},
		{"modelInputs array", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": [1]}`, nil, nil, "error: modelInputs must be a JSON object"},
		{"modelInputs string", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": "{}"}`, nil, nil, "error: modelInputs must be a JSON object"},
		{"modelInputs not UTF-8", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {"p": "caf` + "\xe9" + `"}}`, nil, nil, "error: request body is not valid UTF-8 at byte 81"},
		{"startOnly not a boolean", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {}, "startOnly": "yes"}`, nil, nil, "error: startOnly must be a boolean (true or false)"},
		{"invalid apiKey", "/start/v4", `{"apiKey": "nope", "modelKey": "mk-echo", "modelInputs": {}}`, nil, nil, "error: invalid apiKey"},
		{"revoked apiKey", "/start/v4", `{"apiKey": "` + keyRevoked + `", "modelKey": "mk-echo", "modelInputs": {}}`, nil, nil, "error: invalid apiKey"},
		{"unknown modelKey", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-nope", "modelInputs": {}}`, nil, nil, "error: unknown modelKey"},
		{"another team's modelKey", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-hidden", "modelInputs": {}}`, nil, nil, "error: unknown modelKey"},
		{"queue full passes through", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {}}`, queueFull, nil, "error: queue full (1000 calls waiting); retry later"},
		{"needs GPUs passes through", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {}}`, errors.New("project needs 2 GPUs, this machine has 0"), nil, "error: project needs 2 GPUs, this machine has 0"},
		{"storage full", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {}}`, fmt.Errorf("save call: %w", store.ErrStorageFull), nil, "error: storage full; the call was not accepted"},
		{"store failure in submit is internal", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {}}`, fmt.Errorf("save call: %w", store.ErrClosed), nil, "error: internal error: *"},
		{"store failure in auth is internal", "/check/v4", `{"apiKey": "` + keyAcme + `", "callID": "x"}`, nil, errors.New("disk on fire"), "error: internal error: disk on fire"},
		{"missing callID", "/check/v4", `{"apiKey": "` + keyAcme + `"}`, nil, nil, "error: missing callID"},
		{"callID not a string", "/check/v4", `{"apiKey": "` + keyAcme + `", "callID": 7}`, nil, nil, "error: callID must be a string"},
		{"longPoll not a boolean", "/check/v4", `{"apiKey": "` + keyAcme + `", "callID": "call_x", "longPoll": "true"}`, nil, nil, "error: longPoll must be a boolean (true or false)"},
		{"check invalid apiKey", "/check/v4", `{"apiKey": "nope", "callID": "call_theirs"}`, nil, nil, "error: invalid apiKey"},
		{"check revoked apiKey", "/check/v3", `{"apiKey": "` + keyRevoked + `", "callID": "call_theirs"}`, nil, nil, "error: invalid apiKey"},
		{"unknown callID", "/check/v4", `{"apiKey": "` + keyAcme + `", "callID": "call_nope"}`, nil, nil, "error: callID not found (unknown, expired, or not yours)"},
		{"another team's callID", "/check/v4", `{"apiKey": "` + keyAcme + `", "callID": "call_theirs"}`, nil, nil, "error: callID not found (unknown, expired, or not yours)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			env.sched.add(store.Call{ID: "call_theirs", ProjectID: "hidden", TeamID: "other", State: store.CallRunning})
			env.sched.submitErr = tc.submitErr
			env.store.authErr = tc.authErr
			m := inferenceReply(t, serve(env.h, http.MethodPost, tc.path, tc.body))
			msg := m["message"].(string)
			if prefix, ok := strings.CutSuffix(tc.want, "*"); ok {
				if !strings.HasPrefix(msg, prefix) {
					t.Errorf("message %q, want prefix %q", msg, prefix)
				}
			} else if msg != tc.want {
				t.Errorf("message %q, want %q", msg, tc.want)
			}
			if m["callID"] != "" || m["finished"] != false || m["modelOutputs"] != nil {
				t.Errorf("callID %v finished %v modelOutputs %v, want \"\", false, null", m["callID"], m["finished"], m["modelOutputs"])
			}
			if strings.Contains(env.logs(), keyAcme) {
				t.Error("an API key reached the log")
			}
		})
	}
}

func TestInferenceBodyLimit(t *testing.T) {
	big := `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {"pad": "` + strings.Repeat("x", 300) + `"}}`
	tests := []struct {
		name    string
		chunked bool
	}{
		{"with Content-Length", false},
		{"chunked", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{MaxBodyBytes: 256})
			req := httptest.NewRequest(http.MethodPost, "/start/v4", strings.NewReader(big))
			if tc.chunked {
				req.ContentLength = -1
				req.Body = io.NopCloser(strings.NewReader(big))
			}
			rec := httptest.NewRecorder()
			env.h.ServeHTTP(rec, req)
			m := inferenceReply(t, rec)
			if want := "error: request body is larger than 256 bytes"; m["message"] != want {
				t.Errorf("message %q, want %q", m["message"], want)
			}
		})
	}
}

// TestInferenceOverRealHTTP sends chunked bodies and trailing-slash paths
// through a real server and client that does not follow redirects.
func TestInferenceOverRealHTTP(t *testing.T) {
	env := newEnv(t, Options{})
	env.sched.add(store.Call{ID: "call_mine", TeamID: "acme", State: store.CallSucceeded, Outputs: json.RawMessage(`{"y":1}`)})
	srv := httptest.NewServer(env.h)
	t.Cleanup(srv.Close)
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	start := `{"id": "8a3f...", "created": 1700000000, "apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "startOnly": true, "modelInputs": {"x": 1}}`
	check := `{"apiKey": "` + keyAcme + `", "callID": "call_mine"}`
	tests := []struct {
		name, path, body, want string
		chunked                bool
	}{
		{"start", "/start/v4", start, "queued", false},
		{"start trailing slash", "/start/v4/", start, "queued", false},
		{"start chunked", "/start/v4", start, "queued", true},
		{"start v3 trailing slash chunked", "/start/v3/", start, "queued", true},
		{"check", "/check/v4", check, "success", false},
		{"check trailing slash", "/check/v4/", check, "success", false},
		{"check v3", "/check/v3", check, "success", false},
		{"check v3 trailing slash chunked", "/check/v3/", check, "success", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var body io.Reader = strings.NewReader(tc.body)
			if tc.chunked {
				body = io.MultiReader(body) // unknown length: the client sends it chunked
			}
			req, err := http.NewRequest(http.MethodPost, srv.URL+tc.path, body)
			if err != nil {
				t.Fatal(err)
			}
			resp, err := client.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			if tc.chunked && req.ContentLength != 0 {
				t.Fatalf("request was not chunked (ContentLength %d)", req.ContentLength)
			}
			rec := httptest.NewRecorder()
			rec.Code = resp.StatusCode
			maps.Copy(rec.Header(), resp.Header)
			if _, err := io.Copy(rec.Body, resp.Body); err != nil {
				t.Fatal(err)
			}
			m := inferenceReply(t, rec)
			if m["message"] != tc.want {
				t.Errorf("message %q, want %q", m["message"], tc.want)
			}
		})
	}
}

func TestStartReturnsResultWhenCallFinishesInTime(t *testing.T) {
	tests := []struct {
		name         string
		state        store.CallState
		outputs      string
		message      string
		wantMessage  string
		wantOutputs  string
		wantFinished bool
	}{
		{"success", store.CallSucceeded, `{"reply":"hi"}`, "success", "success", `[{"reply":"hi"}]`, true},
		{"inference timeout", store.CallFailed, "", "error: inference timed out after 300s", "error: inference timed out after 300s", "null", true},
		{"failure without error prefix", store.CallFailed, "", "model exploded", "error: model exploded", "null", true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{StartWait: time.Hour})
			res := serveAsync(env.h, http.MethodPost, "/start/v4",
				`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "modelInputs": {"x": 1}}`)
			waitLookup(t, env.sched, "call_1") // the handler holds the done channel
			env.sched.finish("call_1", tc.state, tc.outputs, tc.message)
			rec := waitResult(t, res)
			m := inferenceReply(t, rec)
			if m["message"] != tc.wantMessage || m["finished"] != tc.wantFinished || m["callID"] != "call_1" {
				t.Errorf("got message %q finished %v callID %v", m["message"], m["finished"], m["callID"])
			}
			got := decode[struct{ ModelOutputs json.RawMessage }](t, rec)
			if string(got.ModelOutputs) != tc.wantOutputs {
				t.Errorf("modelOutputs %s, want %s", got.ModelOutputs, tc.wantOutputs)
			}
		})
	}
}

func TestStartOnlyReturnsCallIDAtOnce(t *testing.T) {
	env := newEnv(t, Options{StartWait: time.Hour})
	rec := serve(env.h, http.MethodPost, "/start/v4",
		`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "startOnly": true, "modelInputs": {}}`)
	m := inferenceReply(t, rec)
	if m["callID"] != "call_1" || m["finished"] != false || m["message"] != "queued" || m["modelOutputs"] != nil {
		t.Errorf("got %v", m)
	}
	if m["apiVersion"] != "inferd/test" {
		t.Errorf("apiVersion %v", m["apiVersion"])
	}
}

func TestAdminKeyMayStartAnyTeamsProject(t *testing.T) {
	env := newEnv(t, Options{})
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4",
		`{"apiKey": "`+keyAdmin+`", "modelKey": "mk-hidden", "startOnly": true, "modelInputs": {}}`))
	if m["callID"] != "call_1" {
		t.Errorf("got %v", m)
	}
}

func TestStartReturnsCallIDWhenWaitExpires(t *testing.T) {
	env := newEnv(t, Options{StartWait: time.Millisecond})
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4",
		`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "modelInputs": {}}`))
	if m["callID"] != "call_1" || m["finished"] != false || m["message"] != "queued" || m["modelOutputs"] != nil {
		t.Errorf("got %v", m)
	}
}

func TestStartClientGoneDoesNotCancelCall(t *testing.T) {
	env := newEnv(t, Options{StartWait: time.Hour})
	ctx, cancel := context.WithCancel(context.Background())
	cancel() // the client is already gone
	req := httptest.NewRequestWithContext(ctx, http.MethodPost, "/start/v4",
		strings.NewReader(`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "modelInputs": {}}`))
	rec := httptest.NewRecorder()
	env.h.ServeHTTP(rec, req) // returns without waiting an hour
	m := inferenceReply(t, rec)
	if m["callID"] != "call_1" || m["message"] != "queued" {
		t.Errorf("got %v", m)
	}
	if err := env.sched.submitCtx.Err(); err != nil {
		t.Errorf("Submit's context is done (%v): the call would be cancelled", err)
	}
}

func TestCheckReportsState(t *testing.T) {
	finished := time.Unix(1700000010, 0)
	tests := []struct {
		name        string
		call        store.Call
		key         string
		wantMessage string
		wantOutputs string
		wantFields  []string // timing fields that must be present
		absent      []string
	}{
		{"queued", store.Call{ID: "c1", TeamID: "acme", State: store.CallQueued}, keyAcme, "queued", "null", nil, []string{"queueMs", "bootMs", "runMs"}},
		{"booting", store.Call{ID: "c1", TeamID: "acme", State: store.CallBooting, BootMs: 1200}, keyAcme, "booting", "null", []string{"bootMs"}, []string{"queueMs", "runMs"}},
		{"running", store.Call{ID: "c1", TeamID: "acme", State: store.CallRunning, Dispatched: finished, QueueMs: 4}, keyAcme, "running", "null", []string{"queueMs"}, []string{"runMs"}},
		{"succeeded", store.Call{ID: "c1", TeamID: "acme", State: store.CallSucceeded, Outputs: json.RawMessage(`{"a":[1,2]}`), Dispatched: finished, Finished: finished, QueueMs: 0, RunMs: 9}, keyAcme, "success", `[{"a":[1,2]}]`, []string{"queueMs", "runMs"}, []string{"bootMs", "batchSize", "batchWaitMs"}},
		{"succeeded in a batch", store.Call{ID: "c1", TeamID: "acme", State: store.CallSucceeded, Outputs: json.RawMessage(`1`), Dispatched: finished, Finished: finished, BatchSize: 8}, keyAcme, "success", `[1]`, []string{"queueMs", "runMs", "batchSize", "batchWaitMs"}, []string{"bootMs"}},
		{"failed", store.Call{ID: "c1", TeamID: "acme", State: store.CallFailed, Message: "error: model process exited (signal killed) during inference", Dispatched: finished, RunMs: 3}, keyAcme, "error: model process exited (signal killed) during inference", "null", []string{"queueMs", "runMs"}, nil},
		{"admin sees another team's call", store.Call{ID: "c1", TeamID: "acme", State: store.CallRunning}, keyAdmin, "running", "null", nil, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			env.sched.add(tc.call)
			rec := serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+tc.key+`", "callID": "c1"}`)
			m := inferenceReply(t, rec)
			if m["message"] != tc.wantMessage || m["callID"] != "c1" || m["finished"] != tc.call.State.Done() {
				t.Errorf("got %v", m)
			}
			got := decode[struct{ ModelOutputs json.RawMessage }](t, rec)
			if string(got.ModelOutputs) != tc.wantOutputs {
				t.Errorf("modelOutputs %s, want %s", got.ModelOutputs, tc.wantOutputs)
			}
			for _, f := range tc.wantFields {
				if _, ok := m[f].(float64); !ok {
					t.Errorf("%s = %#v, want a number", f, m[f])
				}
			}
			for _, f := range tc.absent {
				if _, ok := m[f]; ok {
					t.Errorf("%s present, want absent", f)
				}
			}
		})
	}
}

// TestCheckLongPollWakesWhenCallFinishes has several long polls wait on one
// call: all wake on its single completion signal, long before the hour.
func TestCheckLongPollWakesWhenCallFinishes(t *testing.T) {
	env := newEnv(t, Options{LongPollWait: time.Hour})
	env.sched.add(store.Call{ID: "c1", TeamID: "acme", State: store.CallRunning})
	const waiters = 3
	var results []<-chan *httptest.ResponseRecorder
	for range waiters {
		results = append(results, serveAsync(env.h, http.MethodPost, "/check/v4",
			`{"apiKey": "`+keyAcme+`", "callID": "c1", "longPoll": true}`))
	}
	for range waiters {
		waitLookup(t, env.sched, "c1")
	}
	env.sched.finish("c1", store.CallSucceeded, `{"done":true}`, "success")
	for _, res := range results {
		m := inferenceReply(t, waitResult(t, res))
		if m["message"] != "success" || m["finished"] != true {
			t.Errorf("got %v", m)
		}
		outs, _ := m["modelOutputs"].([]any)
		if len(outs) != 1 {
			t.Errorf("modelOutputs %v, want one reply", m["modelOutputs"])
		}
	}
}

func TestCheckLongPollReturnsStateWhenWaitExpires(t *testing.T) {
	env := newEnv(t, Options{LongPollWait: time.Millisecond})
	env.sched.add(store.Call{ID: "c1", TeamID: "acme", State: store.CallQueued})
	res := serveAsync(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "c1", "longPoll": true}`)
	m := inferenceReply(t, waitResult(t, res))
	if m["message"] != "queued" || m["finished"] != false {
		t.Errorf("got %v", m)
	}
}

func TestInferencePanicAnswersWithErrorMessage(t *testing.T) {
	env := newEnv(t, Options{})
	env.store.authPanic = true
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4",
		`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "modelInputs": {}}`))
	if m["message"] != "error: internal error" {
		t.Errorf("message %q", m["message"])
	}
	if !strings.Contains(env.logs(), "handler panicked") || !strings.Contains(env.logs(), "stack") {
		t.Errorf("panic not logged with its stack: %s", env.logs())
	}
}

func TestPendingMessagesNeverSayError(t *testing.T) {
	for _, c := range []store.Call{
		{State: store.CallQueued}, {State: store.CallBooting}, {State: store.CallRunning}, {}, {State: "error-ish"},
		{State: store.CallBooting, Message: "booting (attempt 2 of 3; last: ModuleNotFoundError)"},
	} {
		if m := pendingMessage(c); strings.Contains(strings.ToLower(m), "error") || m == "" {
			t.Errorf("pendingMessage(%+v) = %q", c, m)
		}
	}
	attempt := store.Call{State: store.CallBooting, Message: "booting (attempt 2 of 3; last: process exited with status 1)"}
	if m := pendingMessage(attempt); m != attempt.Message {
		t.Errorf("pendingMessage(%+v) = %q, want the scheduler's account", attempt, m)
	}
}

func BenchmarkStartSync(b *testing.B) {
	env := newEnv(b, Options{})
	env.sched.instant = true
	env.sched.lookups = nil
	env.h = New(Options{Log: zerolog.New(io.Discard), APIVersion: "inferd/bench"}, env.store, env.sched)
	body := `{"id": "6f1c1a52-5a2e-4f0e-9d8c-1c1e0b7a4d11", "created": 1700000000, "apiKey": "` + keyAcme +
		`", "modelKey": "mk-echo", "startOnly": false, "modelInputs": {"prompt": "hello world", "max_tokens": 16}}`
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/start/v4", strings.NewReader(body))
		rec := httptest.NewRecorder()
		env.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"success"`) {
			b.Fatalf("got %d %s", rec.Code, rec.Body)
		}
	}
}

func BenchmarkCheck(b *testing.B) {
	env := newEnv(b, Options{})
	env.sched.lookups = nil
	env.h = New(Options{Log: zerolog.New(io.Discard), APIVersion: "inferd/bench"}, env.store, env.sched)
	env.sched.add(store.Call{ID: "call_0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", TeamID: "acme", State: store.CallSucceeded,
		Outputs: json.RawMessage(`{"text": "hello back", "tokens": 3}`), Dispatched: time.Now(), QueueMs: 1, RunMs: 12})
	body := `{"id": "6f1c1a52-5a2e-4f0e-9d8c-1c1e0b7a4d11", "created": 1700000000, "apiKey": "` + keyAcme +
		`", "callID": "call_0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "longPoll": true}`
	b.ReportAllocs()
	for b.Loop() {
		req := httptest.NewRequest(http.MethodPost, "/check/v4", strings.NewReader(body))
		rec := httptest.NewRecorder()
		env.h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), `"success"`) {
			b.Fatalf("got %d %s", rec.Code, rec.Body)
		}
	}
}

// TestDefaultWaitsAreFiftySeconds runs on synctest's fake clock: a call that
// never finishes is answered after exactly the default wait.
func TestDefaultWaitsAreFiftySeconds(t *testing.T) {
	tests := []struct {
		name, path, body string
	}{
		{"start", "/start/v4", `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {}}`},
		{"check longPoll", "/check/v4", `{"apiKey": "` + keyAcme + `", "callID": "c1", "longPoll": true}`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				env := newEnv(t, Options{})
				env.sched.add(store.Call{ID: "c1", TeamID: "acme", State: store.CallQueued})
				began := time.Now()
				m := inferenceReply(t, serve(env.h, http.MethodPost, tc.path, tc.body))
				if waited := time.Since(began); waited != 50*time.Second {
					t.Errorf("waited %v, want 50s", waited)
				}
				if m["message"] != "queued" || m["finished"] != false || m["callID"] == "" {
					t.Errorf("got %v", m)
				}
			})
		})
	}
}

// The outputs go into the answer as the store holds them, byte for byte:
// never decoded and encoded again (a check of a 5 MB result would cost a
// validation and two copies). Their validity is the model client's
// concern: it refuses a reply that is not JSON (backend.ErrInvalidReply).
func TestCheckWritesModelOutputsAsStored(t *testing.T) {
	env := newEnv(t, Options{})
	raw := `{"a": 1,  "s":"\u00e9\/", "n":[1.50, 2e3]}`
	env.sched.add(store.Call{ID: "c1", TeamID: "acme", State: store.CallSucceeded, Outputs: json.RawMessage(" " + raw + "\n")})
	rec := serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "c1"}`)
	body := rec.Body.String()
	if !strings.HasSuffix(body, `,"modelOutputs":[`+raw+"]}\n") {
		t.Errorf("answer = %s; want modelOutputs [%s], the stored bytes", body, raw)
	}
	if got := rec.Header().Get("Content-Length"); got != strconv.Itoa(len(body)) {
		t.Errorf("Content-Length = %s, body %d bytes", got, len(body))
	}
	m := inferenceReply(t, rec)
	if m["message"] != "success" || m["finished"] != true {
		t.Errorf("got %v", m)
	}
}

// With Options.StartLookup (cluster mode: the key and the project in one
// read), a start answers exactly as with the two reads: the key first, so
// that a refused key never learns whether its modelKey exists, then the
// project, another team's hidden as unknown.
func TestStartWithOneLookupAnswersAsTwoReads(t *testing.T) {
	var lookups atomic.Int64
	env := newEnv(t, Options{})
	env.sched.instant = true
	env.h = New(Options{Log: zerolog.New(io.Discard), APIVersion: "inferd/test",
		StartLookup: func(secret, modelKey string) store.StartLookup {
			lookups.Add(1)
			var l store.StartLookup
			l.Key, l.KeyErr = env.store.Authenticate(secret)
			l.Project, l.ProjectErr = env.store.ProjectByModelKey(modelKey)
			return l
		}}, env.store, env.sched)
	for _, tc := range []struct{ key, modelKey, want string }{
		{keyAcme, "mk-echo", "success"},
		{keyAcme, "mk-nobody", "error: unknown modelKey"},
		{keyAcme, "mk-hidden", "error: unknown modelKey"},
		{keyRevoked, "mk-nobody", "error: invalid apiKey"},
		{"not-a-key", "mk-echo", "error: invalid apiKey"},
	} {
		m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4",
			`{"apiKey": "`+tc.key+`", "modelKey": "`+tc.modelKey+`", "modelInputs": {}}`))
		if m["message"] != tc.want {
			t.Errorf("start with %s, %s: message %q, want %q", tc.key, tc.modelKey, m["message"], tc.want)
		}
	}
	if n := lookups.Load(); n != 5 {
		t.Errorf("%d lookups for 5 starts, want one each", n)
	}
}
