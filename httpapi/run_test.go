package httpapi

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"inferd/scheduler"
	"inferd/store"
)

func TestRunStatusCodesFollowWhatTheBananaClientDoes(t *testing.T) {
	key := []string{"X-Banana-API-Key", keyAcme}
	tests := []struct {
		name      string
		path      string
		body      string
		header    []string
		submitErr error
		maxBody   int64
		status    int
		contains  string
	}{
		{"success is the model's JSON", "/run/echo/", `{"prompt":"hi"}`, key, nil, 0, 200, `{"ok":true}`},
		{"a second route", "/run/echo/second", `{}`, key, nil, 0, 200, `{"ok":true}`},
		{"no trailing slash", "/run/echo", `{}`, key, nil, 0, 200, `{"ok":true}`},
		{"lower-case header", "/run/echo/", `{}`, []string{"x-banana-api-key", keyAcme}, nil, 0, 200, `{"ok":true}`},
		{"no key", "/run/echo/", `{}`, nil, nil, 0, 401, "missing API key"},
		{"bad key", "/run/echo/", `{}`, []string{"X-Banana-API-Key", "ik_0000000000_nope"}, nil, 0, 401, "invalid API key"},
		{"unknown project", "/run/nope/", `{}`, key, nil, 0, 404, "project not found"},
		{"another team's project", "/run/hidden/", `{}`, key, nil, 0, 404, "project not found"},
		{"a route that is no path", "/run/echo/a/../b", `{}`, key, nil, 0, 404, "no such route"},
		{"malformed body is 422, never 400", "/run/echo/", `{"a":`, key, nil, 0, 422, "not valid JSON"},
		{"oversize body", "/run/echo/", `{"a":"` + strings.Repeat("x", 2048) + `"}`, key, nil, 1024, 413, "larger than 1024 bytes"},
		{"queue full is retried", "/run/echo/", `{}`, key, fmt.Errorf("%w (1000 calls waiting)", scheduler.ErrQueueFull), 0, 503, "queue full"},
		{"shutting down is retried", "/run/echo/", `{}`, key, errors.New("scheduler is not running"), 0, 503, "not running"},
		{"too few GPUs is final", "/run/echo/", `{}`, key, fmt.Errorf("%w: needs 2, has 0", scheduler.ErrNeedsGPUs), 0, 500, "GPUs"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{MaxBodyBytes: tc.maxBody})
			env.sched.instant = true
			env.sched.submitErr = tc.submitErr
			rec := serve(env.h, http.MethodPost, tc.path, tc.body, tc.header...)
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.contains) {
				t.Fatalf("HTTP %d %q, want %d containing %q", rec.Code, rec.Body.String(), tc.status, tc.contains)
			}
			if tc.status == 200 && !strings.HasPrefix(rec.Header().Get("X-Inferd-Call-Id"), "call_") {
				t.Errorf("X-Inferd-Call-Id %q", rec.Header().Get("X-Inferd-Call-Id"))
			}
		})
	}
}

func TestRunFailedCallIsA500WithItsMessage(t *testing.T) {
	env := newEnv(t, Options{})
	res := make(chan *httptest.ResponseRecorder, 1)
	go func() { res <- serve(env.h, http.MethodPost, "/run/echo/", `{}`, "X-Banana-API-Key", keyAcme) }()
	// The fake admits the call queued; fail it as a handler exception would.
	eventuallyTrue(t, func() bool {
		env.sched.mu.Lock()
		defer env.sched.mu.Unlock()
		return len(env.sched.calls) == 1
	})
	env.sched.finish("call_1", store.CallFailed, "", "error: model raised an exception: ValueError: bad prompt")
	rec := waitResult(t, res)
	if rec.Code != 500 || !strings.Contains(rec.Body.String(), "ValueError: bad prompt") {
		t.Fatalf("HTTP %d %q", rec.Code, rec.Body.String())
	}
}

func TestRunWithAKnownRequestIDAnswersThatCallWithoutANewOne(t *testing.T) {
	env := newEnv(t, Options{})
	env.sched.instant = true // a new call, wrongly made, would answer {"ok":true} at once
	prev := store.Call{ID: "call_prev", ProjectID: "echo", TeamID: "acme", Route: "/second",
		State: store.CallSucceeded, Outputs: []byte(`{"n":1}`), Message: "success",
		Created: time.Now(), IdempotencyKey: "req-1"}
	if err := env.store.SaveCall(context.Background(), prev); err != nil {
		t.Fatal(err)
	}
	env.sched.add(prev)
	hdr := []string{"X-Banana-API-Key", keyAcme, "X-Banana-Request-Id", "req-1"}
	rec := serve(env.h, http.MethodPost, "/run/echo/second", `{}`, hdr...)
	if rec.Code != 200 || strings.TrimSpace(rec.Body.String()) != `{"n":1}` || rec.Header().Get("X-Inferd-Call-Id") != "call_prev" {
		t.Fatalf("HTTP %d %q call %q; want the earlier call's answer", rec.Code, rec.Body.String(), rec.Header().Get("X-Inferd-Call-Id"))
	}
	if env.sched.n != 0 {
		t.Errorf("a new call was admitted for a known request id")
	}
	rec = serve(env.h, http.MethodPost, "/run/echo/", `{}`, hdr...)
	if rec.Code != 422 {
		t.Errorf("the same request id on another route: HTTP %d, want 422", rec.Code)
	}
}

func TestRunAndEventsFollowKeyScopes(t *testing.T) {
	for _, tc := range []struct {
		name, method, path, key string
		status                  int
		mention                 string
	}{
		{"read key may not call", "POST", "/run/echo/", keyReadOnly, 401, "may not start or check calls"},
		{"infer key calls", "POST", "/run/echo/", keyInferOnly, 200, `{"ok":true}`},
		{"infer key warms up", "POST", "/run/echo/_k/warmup", keyInferOnly, 200, `{"ok":true}`},
		{"read key may not warm up", "POST", "/run/echo/_k/warmup", keyReadOnly, 401, "may not start or check calls"},
		{"allowlist keeps other projects out, as missing ones", "POST", "/run/echo/", keyZetaOnly, 404, "project not found"},
		{"read key may not follow a call", "GET", "/v1/calls/call_mine/events", keyReadOnly, 403, "may not start or check calls"},
		{"allowlist hides another project's call", "GET", "/v1/calls/call_mine/events", keyZetaOnly, 404, "call not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := newScopedEnv(t)
			env.sched.instant = true
			env.sched.add(store.Call{ID: "call_mine", ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded, Message: "success"})
			rec := serve(env.h, tc.method, tc.path, `{}`, "X-Banana-API-Key", tc.key)
			if rec.Code != tc.status || !strings.Contains(rec.Body.String(), tc.mention) {
				t.Fatalf("%s %s = %d %s; want %d mentioning %q", tc.method, tc.path, rec.Code, rec.Body, tc.status, tc.mention)
			}
		})
	}
}

// A /run wait may last the project's inferenceTimeout, past the server's
// write timeout, which is sized for start and check.
func TestRunAnswersPastTheServerWriteTimeout(t *testing.T) {
	env := newEnv(t, Options{})
	srv := httptest.NewUnstartedServer(env.h)
	srv.Config.WriteTimeout = 200 * time.Millisecond
	srv.Start()
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/run/echo/", strings.NewReader(`{}`))
	req.Header.Set("X-Banana-API-Key", keyAcme)
	type answer struct {
		status int
		body   string
		err    error
	}
	answered := make(chan answer, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			answered <- answer{err: err}
			return
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		answered <- answer{resp.StatusCode, string(body), err}
	}()
	eventuallyTrue(t, func() bool {
		env.sched.mu.Lock()
		defer env.sched.mu.Unlock()
		return env.sched.n == 1 // the /run call is admitted and waited on
	})
	// The call takes a second from its admission, five write timeouts.
	finish := time.AfterFunc(time.Second, func() { env.sched.finish("call_1", store.CallSucceeded, `{"slow":true}`, "success") })
	defer finish.Stop()
	a := waitResult(t, answered)
	if a.err != nil {
		t.Fatalf("the answer was cut off: %v", a.err)
	}
	if a.status != 200 || strings.TrimSpace(a.body) != `{"slow":true}` {
		t.Fatalf("HTTP %d %s", a.status, a.body)
	}
}
