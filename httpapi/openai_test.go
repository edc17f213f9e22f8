package httpapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/scheduler"
	"inferd/store"
)

// openaiEnv is newEnv with projects of protocol openai: acme's llm (alias
// llama, served as meta/Llama-3) and embed, other's secret-llm.
func openaiEnv(t *testing.T, opts Options) *testEnv {
	t.Helper()
	env := newEnv(t, opts)
	for _, p := range []struct {
		id, team, served string
		aliases          []string
	}{{"llm", "acme", "meta/Llama-3", []string{"llama"}}, {"embed", "acme", "", nil}, {"secret-llm", "other", "", nil}} {
		pr := testProject(p.id, p.team)
		pr.Model.Protocol = store.ProtocolOpenAI
		pr.Model.Aliases, pr.Model.ServedModel = p.aliases, p.served
		env.store.addProject(t, pr, "mk-"+p.id)
	}
	return env
}

func bearer(key string) []string { return []string{"Authorization", "Bearer " + key} }

// oaiErrorReply checks an OpenAI error answer: the status and the shape
// {"error": {"message", "type", "param", "code"}}, and returns the error.
func oaiErrorReply(t *testing.T, rec *httptest.ResponseRecorder, status int, typ, code string) map[string]any {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("HTTP %d, want %d: %s", rec.Code, status, rec.Body)
	}
	var body struct {
		Error map[string]any `json:"error"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil || body.Error == nil {
		t.Fatalf("not an OpenAI error body: %s", rec.Body)
	}
	for _, f := range []string{"message", "type", "param", "code"} {
		if _, ok := body.Error[f]; !ok {
			t.Errorf("error without %q: %s", f, rec.Body)
		}
	}
	if body.Error["type"] != typ || code != "" && body.Error["code"] != code {
		t.Errorf("type %v code %v, want %s %s: %s", body.Error["type"], body.Error["code"], typ, code, rec.Body)
	}
	return body.Error
}

func modelIDs(t *testing.T, rec *httptest.ResponseRecorder) []string {
	t.Helper()
	if rec.Code != http.StatusOK {
		t.Fatalf("GET /v1/models: HTTP %d %s", rec.Code, rec.Body)
	}
	list := decode[modelList](t, rec)
	var ids []string
	for _, m := range list.Data {
		ids = append(ids, m.ID+"@"+m.OwnedBy)
	}
	return ids
}

// GET /v1/models lists the names of the openai projects the key's team may
// call, never another team's or a project of another protocol.
func TestOpenAIModelsListsTheTeamsModelsOnly(t *testing.T) {
	env := openaiEnv(t, Options{})
	if got := strings.Join(modelIDs(t, serve(env.h, "GET", "/v1/models", "", bearer(keyAcme)...)), " "); got != "embed@acme llm@acme llama@acme" {
		t.Errorf("acme sees %q", got)
	}
	if got := strings.Join(modelIDs(t, serve(env.h, "GET", "/v1/models", "", bearer(keyOther)...)), " "); got != "secret-llm@other" {
		t.Errorf("other sees %q", got)
	}
	if got := strings.Join(modelIDs(t, serve(env.h, "GET", "/v1/models", "", bearer(keyAdmin)...)), " "); got != "embed@acme llm@acme llama@acme secret-llm@other" {
		t.Errorf("admin sees %q", got)
	}
	oaiErrorReply(t, serve(env.h, "GET", "/v1/models", "", bearer(keyRevoked)...), 401, "invalid_request_error", "invalid_api_key")
	oaiErrorReply(t, serve(env.h, "GET", "/v1/models", ""), 401, "invalid_request_error", "invalid_api_key")
	oaiErrorReply(t, serve(env.h, "GET", "/v1/models", "", "Authorization", "Basic "+keyAcme), 401, "invalid_request_error", "invalid_api_key")
}

// A chat request becomes a call of the project its model names (id or
// alias), sent to the same path of the server with the served model name;
// the answer is the server's JSON, and X-Inferd-Call-Id names the call.
func TestOpenAIChatIsACallOfTheNamedProject(t *testing.T) {
	env := openaiEnv(t, Options{})
	res := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		res <- serve(env.h, "POST", "/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"hi"}]}`, bearer(keyAcme)...)
	}()
	waitLookup(t, env.sched, "call_1")
	env.sched.mu.Lock()
	req, call := env.sched.lastReq, env.sched.calls["call_1"].call
	env.sched.mu.Unlock()
	if call.ProjectID != "llm" || req.Route != "/v1/chat/completions" || req.QueueTimeout != 300 {
		t.Errorf("call of %s, route %s, queueTimeout %d", call.ProjectID, req.Route, req.QueueTimeout)
	}
	var in map[string]any
	if json.Unmarshal(req.Inputs, &in) != nil || in["model"] != "meta/Llama-3" || in["messages"] == nil {
		t.Errorf("inputs %s: want the request with the served model", req.Inputs)
	}
	env.sched.finish("call_1", store.CallSucceeded, `{"id":"chatcmpl-1","object":"chat.completion","choices":[]}`, "success")
	rec := waitResult(t, res)
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"id":"chatcmpl-1","object":"chat.completion","choices":[]}` {
		t.Errorf("HTTP %d %s", rec.Code, rec.Body)
	}
	if rec.Header().Get(callIDHeader) != "call_1" {
		t.Errorf("X-Inferd-Call-Id %q", rec.Header().Get(callIDHeader))
	}
	// The result stays answerable by its call id, to its team only.
	if rec := serve(env.h, "GET", "/v1/calls/call_1/response", "", bearer(keyAcme)...); rec.Code != 200 || !strings.Contains(rec.Body.String(), "chatcmpl-1") {
		t.Errorf("GET response: HTTP %d %s", rec.Code, rec.Body)
	}
	oaiErrorReply(t, serve(env.h, "GET", "/v1/calls/call_1/response", "", bearer(keyOther)...), 404, "invalid_request_error", "not_found")
}

// A model the team may not call is not found, whether it exists elsewhere
// or not at all; nothing is started. (The team's own project of another
// protocol says what it is: TestAnHTTPProjectNamedAsAModelSaysHowToCallIt.)
func TestOpenAIUnknownOrOtherTeamsModelIs404(t *testing.T) {
	env := openaiEnv(t, Options{})
	for _, model := range []string{"secret-llm", "gpt-4", "hidden"} {
		rec := serve(env.h, "POST", "/v1/chat/completions", `{"model":"`+model+`","messages":[]}`, bearer(keyAcme)...)
		e := oaiErrorReply(t, rec, 404, "invalid_request_error", "model_not_found")
		if e["param"] != "model" || strings.Contains(e["message"].(string), model) {
			t.Errorf("%s: %v", model, e)
		}
	}
	oaiErrorReply(t, serve(env.h, "POST", "/v1/embeddings", `{"model":"embed","input":"x"}`, bearer("ik_000000000e_nope")...), 401, "invalid_request_error", "invalid_api_key")
	oaiErrorReply(t, serve(env.h, "POST", "/v1/chat/completions", `{"messages":[]}`, bearer(keyAcme)...), 400, "invalid_request_error", "")
	if env.sched.n != 0 {
		t.Errorf("%d calls started", env.sched.n)
	}
}

// A full queue or a team at its quota is a 429 with Retry-After.
func TestOpenAIQueueFullIs429WithRetryAfter(t *testing.T) {
	env := openaiEnv(t, Options{})
	for _, err := range []error{fmtErr(scheduler.ErrQueueFull), fmtErr(scheduler.ErrTeamQuota)} {
		env.sched.submitErr = err
		rec := serve(env.h, "POST", "/v1/embeddings", `{"model":"embed","input":"x"}`, bearer(keyAcme)...)
		oaiErrorReply(t, rec, 429, "rate_limit_error", "queue_full")
		if rec.Header().Get("Retry-After") == "" {
			t.Errorf("%v: no Retry-After", err)
		}
	}
}

func fmtErr(err error) error { return errors.Join(err) }

// A failed call answers with the status its failure kind calls for: the
// model's own error, status and Retry-After, 503 (to retry) for a call
// that never got a ready replica within the wait, 504 for a timeout, a
// 400 that no client retries for a cancelled call.
func TestOpenAIFailedCallStatuses(t *testing.T) {
	const tooLong = `{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`
	for _, tc := range []struct {
		msg        string
		how        store.Failure
		status     int
		typ, code  string
		retryAfter string
		final      bool
	}{
		{"error: model returned HTTP 400: " + tooLong, store.Failure{Kind: store.FailModelStatus, Status: 400, Body: tooLong},
			400, "invalid_request_error", "context_length_exceeded", "", false},
		{"error: model returned HTTP 500: boom", store.Failure{Kind: store.FailModelStatus, Status: 500, Body: "boom"}, 502, "server_error", "", "", false},
		{"error: model returned HTTP 429: slow down", store.Failure{Kind: store.FailModelStatus, Status: 429, Body: "slow down", RetryAfter: "7"},
			429, "rate_limit_error", "", "7", false},
		{"error: model returned HTTP 503", store.Failure{Kind: store.FailModelStatus, Status: 503, RetryAfter: "Wed, 21 Oct 2026 07:28:00 GMT"},
			503, "service_unavailable", "", "Wed, 21 Oct 2026 07:28:00 GMT", false},
		{"error: expired after 300s in the queue", store.Failure{Kind: store.FailExpired}, 503, "service_unavailable", "model_not_ready", "5", false},
		{"error: inference timed out after 300s", store.Failure{Kind: store.FailTimeout}, 504, "timeout", "timeout", "", false},
		{"error: model failed to start: process exited with status 1", store.Failure{Kind: store.FailNotStarted}, 503, "server_error", "model_failed_to_start", "", false},
		{"error: model process exited (signal: killed) during inference", store.Failure{Kind: store.FailModel}, 502, "server_error", "model_error", "", false},
		{"error: cancelled by request", store.Failure{Kind: store.FailCancelled}, 400, "invalid_request_error", "cancelled", "", true},
	} {
		env := openaiEnv(t, Options{})
		res := make(chan *httptest.ResponseRecorder, 1)
		go func() {
			res <- serve(env.h, "POST", "/v1/completions", `{"model":"llm","prompt":"x"}`, bearer(keyAcme)...)
		}()
		waitLookup(t, env.sched, "call_1")
		env.sched.fail("call_1", tc.how, tc.msg)
		rec := waitResult(t, res)
		oaiErrorReply(t, rec, tc.status, tc.typ, tc.code)
		if got := rec.Header().Get("Retry-After"); got != tc.retryAfter {
			t.Errorf("%s: Retry-After %q, want %q", tc.msg, got, tc.retryAfter)
		}
		if got := rec.Header().Get("X-Should-Retry") == "false"; got != tc.final {
			t.Errorf("%s: X-Should-Retry %q", tc.msg, rec.Header().Get("X-Should-Retry"))
		}
		if strings.Contains(rec.Body.String(), "error: ") {
			t.Errorf("%s: the inference message's prefix leaked: %s", tc.msg, rec.Body)
		}
	}
}

// sseReader reads the data events of an OpenAI stream as they arrive.
type sseReader struct {
	t    *testing.T
	data chan string // closed at the end of the stream
}

// next returns the next data event; the guard only keeps a test from
// hanging when an event never comes.
func (s *sseReader) next() string {
	s.t.Helper()
	select {
	case d, ok := <-s.data:
		if !ok {
			s.t.Fatal("the stream ended")
		}
		return d
	case <-time.After(testenv.Scale(10 * time.Second)):
		s.t.Fatal("no event within 10s: held back?")
		return ""
	}
}

func openStream(t *testing.T, ctx context.Context, url, key, body string) (*http.Response, *sseReader) {
	t.Helper()
	req, _ := http.NewRequestWithContext(ctx, "POST", url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Error(err)
		return nil, nil
	}
	t.Cleanup(func() { resp.Body.Close() })
	r := &sseReader{t: t, data: make(chan string, 16)}
	go func() {
		defer close(r.data)
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				r.data <- d
			}
		}
	}()
	return resp, r
}

// receive waits for a stream opened on another goroutine.
func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(testenv.Scale(10 * time.Second)):
		t.Fatal("the stream's answer did not come within 10s: held back?")
		var zero T
		return zero
	}
}

// Each chunk reaches the client the moment the model sent it, before the
// call ends; the usage chunk inferd asked for is held back from a client
// that did not ask; the stream ends with [DONE].
func TestOpenAIStreamPassesChunksAsTheyCome(t *testing.T) {
	streams := NewStreams()
	stopping := make(chan struct{})
	env := openaiEnv(t, Options{Streams: streams, Stopping: stopping})
	srv := httptest.NewServer(env.h)
	defer srv.Close()
	defer close(stopping) // first: a handler still streaming ends, so that Close returns
	type opened struct {
		resp *http.Response
		r    *sseReader
	}
	got := make(chan opened, 1)
	go func() {
		resp, r := openStream(t, context.Background(), srv.URL, keyAcme, `{"model":"llm","stream":true,"messages":[]}`)
		got <- opened{resp, r}
	}()
	waitLookup(t, env.sched, "call_1")
	if in := string(env.sched.lastReq.Inputs); !strings.Contains(in, `"stream_options":{"include_usage":true}`) {
		t.Errorf("inputs %s: want the usage chunk asked for", in)
	}
	streams.CallRunning("call_1")
	streams.CallOutput("call_1", json.RawMessage(`{"choices":[{"delta":{"content":"Hel"}}]}`))
	o := receive(t, got)
	if o.resp == nil {
		t.FailNow()
	}
	if ct := o.resp.Header.Get("Content-Type"); o.resp.StatusCode != 200 || !strings.HasPrefix(ct, "text/event-stream") || o.resp.Header.Get(callIDHeader) != "call_1" {
		t.Fatalf("HTTP %d %q %q", o.resp.StatusCode, ct, o.resp.Header.Get(callIDHeader))
	}
	if d := o.r.next(); d != `{"choices":[{"delta":{"content":"Hel"}}]}` {
		t.Fatalf("first chunk %s", d)
	}
	streams.CallOutput("call_1", json.RawMessage("{\"choices\":[{\"delta\":\n{\"content\":\"lo\"}}]}"))
	if d := o.r.next(); d != `{"choices":[{"delta":{"content":"lo"}}]}` {
		t.Fatalf("second chunk %s", d)
	}
	streams.CallOutput("call_1", json.RawMessage(`{"choices":[],"usage":{"prompt_tokens":2,"completion_tokens":2}}`))
	env.sched.mu.Lock()
	env.sched.calls["call_1"].call.Streamed = true
	env.sched.mu.Unlock()
	env.sched.finish("call_1", store.CallSucceeded, `[{},{},{}]`, "success")
	if d := o.r.next(); d != "[DONE]" {
		t.Errorf("after the content %s, want [DONE] (the usage chunk held back)", d)
	}
}

// A client that goes away mid-stream ends its call, as disconnected (not
// cancelled by request: nobody asked for it).
func TestOpenAIStreamClientAbortCancelsTheCall(t *testing.T) {
	streams := NewStreams()
	stopping := make(chan struct{})
	env := openaiEnv(t, Options{Streams: streams, Stopping: stopping})
	srv := httptest.NewServer(env.h)
	defer srv.Close()
	defer close(stopping) // first: a handler still streaming ends, so that Close returns
	ctx, cancel := context.WithCancel(context.Background())
	got := make(chan *sseReader, 1)
	go func() {
		_, r := openStream(t, ctx, srv.URL, keyAcme, `{"model":"llm","stream":true,"stream_options":{"include_usage":true}}`)
		got <- r
	}()
	waitLookup(t, env.sched, "call_1")
	streams.CallOutput("call_1", json.RawMessage(`{"choices":[{"delta":{"content":"a"}}]}`))
	receive(t, got).next()
	cancel()
	env.sched.mu.Lock()
	done := env.sched.calls["call_1"].done
	env.sched.mu.Unlock()
	select {
	case <-done:
	case <-time.After(testenv.Scale(10 * time.Second)):
		t.Fatal("the call was not ended when its client went away")
	}
	if c, _, _ := env.sched.Lookup("call_1"); store.FailureOf(c).Kind != store.FailDisconnected {
		t.Errorf("call ended %q (%+v), want disconnected", c.Message, c.Failure)
	}
}

// A stream whose call fails before its first chunk is answered as a plain
// request: the error and its status.
func TestOpenAIStreamFailingBeforeItsFirstChunk(t *testing.T) {
	env := openaiEnv(t, Options{Streams: NewStreams()})
	res := make(chan *httptest.ResponseRecorder, 1)
	go func() {
		res <- serve(env.h, "POST", "/v1/chat/completions", `{"model":"llm","stream":true}`, bearer(keyAcme)...)
	}()
	waitLookup(t, env.sched, "call_1")
	env.sched.fail("call_1", store.Failure{Kind: store.FailExpired}, "error: expired after 300s in the queue")
	oaiErrorReply(t, waitResult(t, res), 503, "service_unavailable", "model_not_ready")
}
