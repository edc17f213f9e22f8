package httpapi

import (
	"errors"
	"net/http"
	"reflect"
	"testing"

	"inferd/scheduler"
	"inferd/store"
)

func TestStartCallControlFields(t *testing.T) {
	start := func(extra string) string {
		return `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "modelInputs": {}, "startOnly": true` + extra + `}`
	}
	tests := []struct {
		name    string
		body    string
		want    scheduler.Request // the fields other than Inputs
		wantMsg string            // "" = accepted
	}{
		{"none", start(""), scheduler.Request{}, ""},
		{"all", start(`, "timeout": 5, "queueTimeout": 2, "priority": "high", "idempotencyKey": "order-1"`),
			scheduler.Request{Timeout: 5, QueueTimeout: 2, Priority: store.PriorityHigh, IdempotencyKey: "order-1"}, ""},
		{"normal and nulls", start(`, "timeout": null, "priority": "normal", "idempotencyKey": null`),
			scheduler.Request{Priority: store.PriorityNormal}, ""},
		{"low", start(`, "priority": "low"`), scheduler.Request{Priority: store.PriorityLow}, ""},
		{"unknown priority", start(`, "priority": "urgent"`), scheduler.Request{}, `error: priority must be "high", "normal" or "low"`},
		{"priority not a string", start(`, "priority": 1`), scheduler.Request{}, `error: priority must be "high", "normal" or "low"`},
		{"zero timeout", start(`, "timeout": 0`), scheduler.Request{}, "error: timeout must be a whole number of seconds from 1 to 86400"},
		{"fractional queueTimeout", start(`, "queueTimeout": 1.5`), scheduler.Request{}, "error: queueTimeout must be a whole number of seconds from 1 to 86400"},
		{"string timeout", start(`, "timeout": "5"`), scheduler.Request{}, "error: timeout must be a whole number of seconds from 1 to 86400"},
		{"empty idempotencyKey", start(`, "idempotencyKey": ""`), scheduler.Request{}, "error: idempotencyKey must not be empty"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4", tc.body))
			if tc.wantMsg != "" {
				if m["message"] != tc.wantMsg || m["callID"] != "" {
					t.Fatalf("message %q callID %q; want %q and no call", m["message"], m["callID"], tc.wantMsg)
				}
				return
			}
			got := env.sched.lastReq
			got.Inputs = nil
			if m["callID"] == "" || !reflect.DeepEqual(got, tc.want) {
				t.Errorf("request %+v (callID %q); want %+v", got, m["callID"], tc.want)
			}
		})
	}
}

func TestPendingAnswerCarriesQueuePosition(t *testing.T) {
	env := newEnv(t, Options{})
	env.sched.add(store.Call{ID: "call_q", TeamID: "acme", State: store.CallQueued, QueuePosition: 3})
	env.sched.add(store.Call{ID: "call_r", TeamID: "acme", State: store.CallRunning})
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_q"}`))
	if m["message"] != "queued" || m["queuePosition"] != float64(3) {
		t.Errorf("queued answer: message %v, queuePosition %v; want queued, 3", m["message"], m["queuePosition"])
	}
	m = inferenceReply(t, serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_r"}`))
	if _, ok := m["queuePosition"]; ok {
		t.Errorf("running answer has queuePosition %v", m["queuePosition"])
	}
}

func TestCancelAnswersBananaShaped(t *testing.T) {
	tests := []struct {
		name, path, body, want string
	}{
		{"queued call", "/cancel/v4", `{"apiKey": "` + keyAcme + `", "callID": "call_q"}`, "cancelled"},
		{"trailing slash", "/cancel/v4/", `{"apiKey": "` + keyAcme + `", "callID": "call_q"}`, "cancelled"},
		{"finished call", "/cancel/v4", `{"apiKey": "` + keyAcme + `", "callID": "call_done"}`, "error: call already finished (succeeded)"},
		{"another team's call", "/cancel/v4", `{"apiKey": "` + keyAcme + `", "callID": "call_theirs"}`, "error: callID not found (unknown, expired, or not yours)"},
		{"unknown call", "/cancel/v4", `{"apiKey": "` + keyAcme + `", "callID": "call_nope"}`, "error: callID not found (unknown, expired, or not yours)"},
		{"missing callID", "/cancel/v4", `{"apiKey": "` + keyAcme + `"}`, "error: missing callID"},
		{"invalid key", "/cancel/v4", `{"apiKey": "nope", "callID": "call_q"}`, "error: invalid apiKey"},
		{"not JSON", "/cancel/v4", `{`, "error: malformed JSON: unexpected end of JSON input (at byte 1)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			env := newEnv(t, Options{})
			env.sched.add(store.Call{ID: "call_q", ProjectID: "echo", TeamID: "acme", State: store.CallQueued})
			env.sched.add(store.Call{ID: "call_done", ProjectID: "echo", TeamID: "acme", State: store.CallSucceeded, Message: "success"})
			env.sched.add(store.Call{ID: "call_theirs", ProjectID: "hidden", TeamID: "other", State: store.CallQueued})
			m := inferenceReply(t, serve(env.h, http.MethodPost, tc.path, tc.body))
			if m["message"] != tc.want {
				t.Fatalf("message %q, want %q", m["message"], tc.want)
			}
			if theirs, _, _ := env.sched.Lookup("call_theirs"); theirs.State.Done() {
				t.Error("another team's call was cancelled")
			}
			if tc.want != "cancelled" {
				return
			}
			m = inferenceReply(t, serve(env.h, http.MethodPost, "/check/v4", `{"apiKey": "`+keyAcme+`", "callID": "call_q"}`))
			if m["message"] != "error: cancelled by request" || m["finished"] != true {
				t.Errorf("check after cancel: %v", m)
			}
		})
	}
}

func TestPurgeQueue(t *testing.T) {
	env := newEnv(t, Options{})
	for _, id := range []string{"call_1", "call_2"} {
		env.sched.add(store.Call{ID: id, ProjectID: "echo", TeamID: "acme", State: store.CallQueued})
	}
	env.sched.add(store.Call{ID: "call_r", ProjectID: "echo", TeamID: "acme", State: store.CallRunning})
	apiErrorReply(t, serve(env.h, http.MethodDelete, "/v1/projects/hidden/queue", "", "X-Service-API-Key", keyAcme), http.StatusNotFound, "not_found")
	apiErrorReply(t, serve(env.h, http.MethodDelete, "/v1/projects/echo/queue", ""), http.StatusUnauthorized, "unauthorized")
	rec := serve(env.h, http.MethodDelete, "/v1/projects/echo/queue", "", "X-Service-API-Key", keyAcme)
	if got := decode[purgeResult](t, rec); rec.Code != http.StatusOK || got.Removed != 2 {
		t.Fatalf("purge: %d %s; want 200 removed 2", rec.Code, rec.Body)
	}
	if c, _, _ := env.sched.Lookup("call_1"); c.Message != "error: cancelled: queue purged" {
		t.Errorf("purged call = %+v", c)
	}
}

func TestWarmup(t *testing.T) {
	env := newEnv(t, Options{})
	rec := serve(env.h, http.MethodPost, "/v1/projects/echo/warmup", "", "X-Service-API-Key", keyAcme)
	if got := decode[warmupResult](t, rec); rec.Code != http.StatusOK || !got.Ready {
		t.Fatalf("warmup: %d %s", rec.Code, rec.Body)
	}
	apiErrorReply(t, serve(env.h, http.MethodPost, "/v1/projects/hidden/warmup", "", "X-Service-API-Key", keyAcme), http.StatusNotFound, "not_found")
	env.sched.warmErr = errors.New("model failed to start: boom")
	msg := apiErrorReply(t, serve(env.h, http.MethodPost, "/v1/projects/echo/warmup/", "", "X-Service-API-Key", keyAcme), http.StatusServiceUnavailable, "unavailable")
	if msg != "model failed to start: boom" {
		t.Errorf("message %q", msg)
	}
}

func TestCallControlNeedsTheKeysScope(t *testing.T) {
	env := newScopedEnv(t)
	env.sched.add(store.Call{ID: "call_q", ProjectID: "echo", TeamID: "acme", State: store.CallQueued})
	cancel := func(key string) string {
		m := inferenceReply(t, serve(env.h, http.MethodPost, "/cancel/v4", `{"apiKey": "`+key+`", "callID": "call_q"}`))
		return m["message"].(string)
	}
	if got := cancel(keyReadOnly); got != "error: this key may not start or check calls (its scope is read; infer is needed)" {
		t.Errorf("cancel with a read key: %q", got)
	}
	if got := cancel(keyZetaOnly); got != "error: callID not found (unknown, expired, or not yours)" {
		t.Errorf("cancel of a call outside the key's projects: %q", got)
	}
	apiErrorReply(t, serve(env.h, http.MethodDelete, "/v1/projects/echo/queue", "", "X-Service-API-Key", keyInferOnly), http.StatusForbidden, codeForbidden)
	apiErrorReply(t, serve(env.h, http.MethodPost, "/v1/projects/echo/warmup", "", "X-Service-API-Key", keyReadOnly), http.StatusForbidden, codeForbidden)
	apiErrorReply(t, serve(env.h, http.MethodPost, "/v1/projects/echo/warmup", "", "X-Service-API-Key", keyZetaOnly), http.StatusNotFound, codeNotFound)
	if got := cancel(keyInferOnly); got != "cancelled" {
		t.Errorf("cancel with an infer key: %q", got)
	}
}
