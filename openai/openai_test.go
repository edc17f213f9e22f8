package openai

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"

	"inferd/store"
)

func fields(t *testing.T, body []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("body %s: %v", body, err)
	}
	return m
}

func TestParseRequestSetsTheServedModelAndAsksForUsage(t *testing.T) {
	req, err := ParseRequest(ChatCompletions, []byte(`{"model":"llama","stream":true,"messages":[{"role":"user","content":"hi"}],"x_extra":1}`))
	if err != nil {
		t.Fatal(err)
	}
	body, err := req.Body("meta/Llama-3")
	if err != nil {
		t.Fatal(err)
	}
	if req.Model != "llama" || !req.Stream || !req.AddedUsage {
		t.Errorf("read %+v", req)
	}
	got := fields(t, body)
	want := map[string]any{"model": "meta/Llama-3", "stream": true, "messages": []any{map[string]any{"role": "user", "content": "hi"}},
		"x_extra": float64(1), "stream_options": map[string]any{"include_usage": true}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("body %v\nwant %v", got, want)
	}
}

func body(t *testing.T, r Request) []byte {
	t.Helper()
	b, err := r.Body("")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestParseRequestKeepsWhatTheClientAskedOfUsage(t *testing.T) {
	req, err := ParseRequest(Completions, []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":true,"other":2}}`))
	if err != nil {
		t.Fatal(err)
	}
	if req.AddedUsage {
		t.Error("usage the client asked for marked as added")
	}
	if got := fields(t, body(t, req))["stream_options"]; !reflect.DeepEqual(got, map[string]any{"include_usage": true, "other": float64(2)}) {
		t.Errorf("stream_options %v", got)
	}
	// Off, it is turned on, and the chunk hidden again.
	req, _ = ParseRequest(Completions, []byte(`{"model":"m","stream":true,"stream_options":{"include_usage":false}}`))
	if !req.AddedUsage || !reflect.DeepEqual(fields(t, body(t, req))["stream_options"], map[string]any{"include_usage": true}) {
		t.Errorf("include_usage false: %+v %s", req, body(t, req))
	}
	// Not streaming: nothing is added.
	req, _ = ParseRequest(ChatCompletions, []byte(`{"model":"m"}`))
	if req.AddedUsage || req.Stream || fields(t, body(t, req))["stream_options"] != nil {
		t.Errorf("a plain request got %+v %s", req, body(t, req))
	}
}

func TestParseRequestRefusals(t *testing.T) {
	for body, param := range map[string]string{
		`[1]`:                          "",
		`not json`:                     "",
		`null`:                         "",
		`{}`:                           "model",
		`{"model":3}`:                  "model",
		`{"model":"m","stream":"yes"}`: "stream",
		`{"model":"m","stream":true,"stream_options":[]}`:                    "stream_options",
		`{"model":"m","stream":true,"stream_options":{"include_usage":"x"}}`: "stream_options.include_usage",
	} {
		_, err := ParseRequest(ChatCompletions, []byte(body))
		var re *RequestError
		if !errors.As(err, &re) || re.Param != param {
			t.Errorf("%s: got %v, want a RequestError on %q", body, err, param)
		}
	}
	if _, err := ParseRequest(Embeddings, []byte(`{"model":"e","stream":true}`)); err == nil {
		t.Error("a streaming embeddings request was accepted")
	}
}

func TestUsageOfRepliesAndChunks(t *testing.T) {
	for reply, want := range map[string]*store.Tokens{
		`{"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}`: {Prompt: 5, Completion: 7},
		`{"object":"list","usage":{"prompt_tokens":4,"total_tokens":4}}`:        {Prompt: 4},
		`{"choices":[],"usage":null}`:                                           nil,
		`{"choices":[]}`:                                                        nil,
		`[1,2]`:                                                                 nil,
	} {
		got, ok := Usage([]byte(reply))
		if ok != (want != nil) || want != nil && got != *want {
			t.Errorf("Usage(%s) = %+v, %v; want %+v", reply, got, ok, want)
		}
	}
	if !UsageOnly([]byte(`{"id":"c","choices":[],"usage":{"prompt_tokens":1}}`)) {
		t.Error("the include_usage chunk not recognised")
	}
	if UsageOnly([]byte(`{"choices":[{"delta":{"content":"x"}}],"usage":{"prompt_tokens":1}}`)) ||
		UsageOnly([]byte(`{"choices":[],"usage":null}`)) {
		t.Error("a chunk with content, or without usage, taken for the usage chunk")
	}
}

func TestReadEventsHandsEachEventsData(t *testing.T) {
	in := ": comment\n\ndata: {\"a\":1}\n\nevent: x\nid: 3\ndata: {\"b\":\ndata: 2}\r\n\r\ndata: [DONE]\n\ndata: {\"after\":1}\n\n"
	var got []string
	done, err := ReadEvents(strings.NewReader(in), 1<<20, func(d []byte) error { got = append(got, string(d)); return nil })
	if err != nil || !done {
		t.Fatalf("done %v, err %v", done, err)
	}
	if want := []string{`{"a":1}`, "{\"b\":\n2}"}; !reflect.DeepEqual(got, want) {
		t.Errorf("events %q, want %q", got, want)
	}
	// A stream cut without [DONE] hands what it has and says so.
	got = nil
	done, err = ReadEvents(strings.NewReader("data: {\"a\":1}\n\ndata: {\"b\":2}"), 1<<20, func(d []byte) error { got = append(got, string(d)); return nil })
	if err != nil || done || len(got) != 2 {
		t.Errorf("cut stream: done %v, err %v, events %q", done, err, got)
	}
	// Over the limit.
	_, err = ReadEvents(strings.NewReader("data: "+strings.Repeat("x", 100)+"\n\n"), 50, func([]byte) error { return nil })
	if !errors.Is(err, ErrTooLarge) {
		t.Errorf("over the limit: %v", err)
	}
}

func TestModelErrorReadsTheServersShapes(t *testing.T) {
	for body, want := range map[string]string{
		`{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`: `{"error":{"message":"too long","type":"invalid_request_error","param":"messages","code":"context_length_exceeded"}}`,
		`{"error":{"code":400,"message":"bad","type":"invalid_request_error"}}`:                                               `{"error":{"message":"bad","type":"invalid_request_error","param":null,"code":null}}`,
		`{"object":"error","message":"The model x does not exist.","type":"NotFoundError","param":null,"code":404}`:           `{"error":{"message":"The model x does not exist.","type":"NotFoundError","param":null,"code":null}}`,
		`{"detail":"Not Found"}`: ``,
		`oops`:                   ``,
	} {
		e, ok := ModelError([]byte(body))
		var got string
		if ok {
			b, _ := json.Marshal(e)
			got = string(b)
		}
		if got != want {
			t.Errorf("ModelError(%s) = %s, want %s", body, got, want)
		}
	}
}

// A request the server takes as it is (its model is the served name, no
// usage to ask for) goes to it as the client sent it: nothing is decoded
// and encoded again on the way.
func TestABodyWithNothingToChangeGoesAsItCame(t *testing.T) {
	sent := []byte(`{ "model": "m", "messages": [{"role": "user", "content": "hi"}], "z": 1, "a": 2 }`)
	req, err := ParseRequest(ChatCompletions, sent)
	if err != nil {
		t.Fatal(err)
	}
	for _, served := range []string{"", "m"} {
		if b, err := req.Body(served); err != nil || string(b) != string(sent) {
			t.Errorf("Body(%q) = %s, %v; want the body as sent", served, b, err)
		}
	}
	if b, _ := req.Body("other"); fields(t, b)["model"] != "other" {
		t.Errorf("Body(other) = %s", b)
	}
}
