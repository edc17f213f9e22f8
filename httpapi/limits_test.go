package httpapi

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"inferd/store"
)

// A rate that never refills within a test: the burst is all a key gets.
const noRefill = 0.001

func TestRateLimitAnswers429OnProjectAPIAndErrorOnInference(t *testing.T) {
	env := newEnv(t, Options{Limits: Limits{RequestsPerSecond: noRefill, Burst: 2}})
	for i := 0; i < 2; i++ {
		if rec := serve(env.h, http.MethodGet, "/v1/projects", "", "X-Service-API-Key", keyAcme); rec.Code != http.StatusOK {
			t.Fatalf("request %d within the burst: %d %s", i+1, rec.Code, rec.Body)
		}
	}
	msg := apiErrorReply(t, serve(env.h, http.MethodGet, "/v1/projects", "", "X-Service-API-Key", keyAcme),
		http.StatusTooManyRequests, codeRateLimited)
	if !strings.Contains(msg, "rate limit exceeded") {
		t.Errorf("message %q", msg)
	}
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4",
		`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "startOnly": true, "modelInputs": {}}`))
	if !strings.HasPrefix(m["message"].(string), "error: rate limit exceeded") || m["callID"] != "" {
		t.Errorf("start over the rate: %v", m)
	}
	if env.sched.n != 0 {
		t.Errorf("a rate-limited start created %d calls", env.sched.n)
	}
	m = inferenceReply(t, serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_1"}`))
	if !strings.HasPrefix(m["message"].(string), "error: rate limit exceeded") {
		t.Errorf("check over the rate: %v", m)
	}

	// The limit is per key: another team's key is not affected.
	if rec := serve(env.h, http.MethodGet, "/v1/projects", "", "X-Service-API-Key", keyOther); rec.Code != http.StatusOK {
		t.Errorf("another key: %d %s", rec.Code, rec.Body)
	}
	// An invalid key is refused as invalid, not as rate limited.
	apiErrorReply(t, serve(env.h, http.MethodGet, "/v1/projects", "", "X-Service-API-Key", "ik_nope"),
		http.StatusUnauthorized, codeUnauthorized)
}

func TestInputDepthLimit(t *testing.T) {
	env := newEnv(t, Options{Limits: Limits{MaxInputDepth: 3}})
	start := func(inputs string) string {
		m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4",
			`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "startOnly": true, "modelInputs": `+inputs+`}`))
		return m["message"].(string)
	}
	for _, ok := range []string{
		`{"a": {"b": [1, 2]}}`,
		`{"s": "[[[[{{{{ brackets in strings do not count"}`,
		`{"s": "a \" quote then [[[[", "t": {"u": []}}`,
	} {
		if msg := start(ok); msg != "queued" {
			t.Errorf("%s: %q, want queued", ok, msg)
		}
	}
	for _, deep := range []string{`{"a": {"b": {"c": {}}}}`, `{"a": [[[]]]}`} {
		if msg := start(deep); msg != "error: modelInputs nest deeper than 3 levels" {
			t.Errorf("%s: %q", deep, msg)
		}
	}
}

func TestWaitLimitAnswersAtOnceWithTheCallsState(t *testing.T) {
	env := newEnv(t, Options{Limits: Limits{MaxWaitsPerKey: 1}})
	env.sched.add(store.Call{ID: "c1", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
	poll := func(key string) <-chan *httptest.ResponseRecorder {
		return serveAsync(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+key+`", "callID": "c1", "longPoll": true}`)
	}
	a, b := poll(keyAcme), poll(keyAcme)

	// One of the two holds acme's only wait until the call ends; the other
	// is answered at once with the state, not an error.
	var held <-chan *httptest.ResponseRecorder
	select {
	case rec := <-a:
		held = b
		assertPending(t, rec)
	case rec := <-b:
		held = a
		assertPending(t, rec)
	}

	// Another key still gets to wait: its answer is the final result.
	admin := poll(keyAdmin)
	waitLookup(t, env.sched, "c1")
	env.sched.finish("c1", store.CallSucceeded, `{"ok":true}`, "")
	for _, ch := range []<-chan *httptest.ResponseRecorder{held, admin} {
		if m := inferenceReply(t, waitResult(t, ch)); m["message"] != "success" {
			t.Errorf("a waiter within the limit: %v", m)
		}
	}
}

func assertPending(t *testing.T, rec *httptest.ResponseRecorder) {
	t.Helper()
	if m := inferenceReply(t, rec); m["message"] != "running" || m["finished"] != false {
		t.Errorf("over the wait limit: %v, want the running state at once", m)
	}
}

func TestLimiterCountsWaitsPerKeyAndInTotal(t *testing.T) {
	l := newLimiter(Limits{MaxWaitsPerKey: 2, MaxWaits: 3}, nil)
	r1, ok1 := l.beginWait("a")
	_, ok2 := l.beginWait("a")
	_, ok3 := l.beginWait("a")
	if !ok1 || !ok2 || ok3 {
		t.Fatalf("per key: %v %v %v, want true true false", ok1, ok2, ok3)
	}
	_, okB := l.beginWait("b")
	_, okC := l.beginWait("c")
	if !okB || okC {
		t.Fatalf("total: b %v c %v, want true false", okB, okC)
	}
	r1()
	if _, ok := l.beginWait("c"); !ok {
		t.Fatal("a released wait is not given back")
	}
}

func TestLimiterPrunesOnlyIdleKeys(t *testing.T) {
	l := newLimiter(Limits{RequestsPerSecond: noRefill, Burst: 1}, nil)
	if _, ok := l.beginWait("busy"); !ok {
		t.Fatal("beginWait")
	}
	if err := l.allow("spent"); err != nil {
		t.Fatal(err)
	}
	for i := 0; len(l.keys) < pruneAt; i++ {
		l.usage(strings.Repeat("k", i+1)) // fresh, idle entries
	}
	l.usage("one-more") // triggers the prune
	if _, ok := l.keys["busy"]; !ok {
		t.Error("a key with a wait in progress was pruned")
	}
	if err := l.allow("spent"); err == nil {
		t.Error("a key that spent its burst was pruned and got a fresh one")
	}
	if len(l.keys) != 3 {
		t.Errorf("%d keys left, want busy, spent and one-more", len(l.keys))
	}
}

func TestJSONDepth(t *testing.T) {
	for _, tc := range []struct {
		v    string
		max  int
		deep bool
	}{
		{`{}`, 1, false},
		{`{"a":{}}`, 1, true},
		{`{"a":"{{{{"}`, 1, false},
		{`{"a":"\\"}`, 1, false},
		{`{"a":"\\\"{{"}`, 1, false},
		{`[[],[],[[]]]`, 2, true},
		{`[[],[],[]]`, 2, false},
	} {
		if got := jsonDepthExceeds([]byte(tc.v), tc.max); got != tc.deep {
			t.Errorf("jsonDepthExceeds(%s, %d) = %v", tc.v, tc.max, got)
		}
	}
}

// In a cluster each node allows its part of a key's rate and burst (the
// live nodes share them), at least one request: three nodes with a burst
// of 6 allow 2 each; a node that finds itself alone gets the whole burst
// back as the bucket refills; with more nodes than the burst, one each.
func TestLimiterAllowsThisNodesPartOfAKeysRate(t *testing.T) {
	nodes := 3
	l := newLimiter(Limits{RequestsPerSecond: noRefill, Burst: 6}, func() int { return nodes })
	allowed := func(id string, tries int) int {
		n := 0
		for range tries {
			if l.allow(id) == nil {
				n++
			}
		}
		return n
	}
	if got := allowed("k", 10); got != 2 {
		t.Errorf("three nodes sharing a burst of 6: this one allowed %d; want 2", got)
	}
	if u := l.keys["k"]; u.rate.Burst() != 6/3 || float64(u.rate.Limit()) != noRefill/3 {
		t.Errorf("this node's part: burst %d, rate %g; want 2 and a third of the rate", u.rate.Burst(), float64(u.rate.Limit()))
	}
	nodes = 1
	l.allow("k")
	if u := l.keys["k"]; u.rate.Burst() != 6 || float64(u.rate.Limit()) != noRefill {
		t.Errorf("alone: burst %d, rate %g; want the key's whole", u.rate.Burst(), float64(u.rate.Limit()))
	}
	nodes = 9
	if got := allowed("fresh", 3); got != 1 {
		t.Errorf("nine nodes sharing a burst of 6: this one allowed %d; want 1", got)
	}
}
