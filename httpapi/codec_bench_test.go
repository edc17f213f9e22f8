package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"inferd/store"
)

// The JSON work of one start and one check, apart from routing, auth and
// the scheduler: decoding the request body and encoding the answer.

const benchStartBody = `{"id": "6f1c1a52-5a2e-4f0e-9d8c-1c1e0b7a4d11", "created": 1700000000, "apiKey": "k-0123456789abcdef", "modelKey": "mk-echo", "startOnly": false, "modelInputs": {"prompt": "hello world", "max_tokens": 16}}`

const benchCheckBody = `{"id": "6f1c1a52-5a2e-4f0e-9d8c-1c1e0b7a4d11", "created": 1700000000, "apiKey": "k-0123456789abcdef", "callID": "call_0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", "longPoll": true}`

func BenchmarkDecodeStart(b *testing.B) {
	a := &api{opts: Options{MaxBodyBytes: 1 << 20}}
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/start/v4", strings.NewReader(benchStartBody))
		if _, err := a.decodeStart(nil, r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeCheck(b *testing.B) {
	a := &api{opts: Options{MaxBodyBytes: 1 << 20}}
	b.ReportAllocs()
	for b.Loop() {
		r := httptest.NewRequest(http.MethodPost, "/check/v4", strings.NewReader(benchCheckBody))
		if _, err := a.decodeCheck(nil, r); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkEncodeAnswer(b *testing.B) {
	a := &api{opts: Options{APIVersion: "inferd/bench"}}
	c := store.Call{ID: "call_0190a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b", State: store.CallSucceeded,
		Outputs: json.RawMessage(`{"text": "hello back", "tokens": 3}`), Dispatched: time.Now(), QueueMs: 1, RunMs: 12}
	b.ReportAllocs()
	for b.Loop() {
		resp := a.callResponse(c, reachesNone)
		if _, err := resp.answer(resp); err != nil {
			b.Fatal(err)
		}
	}
}
