package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"inferd/scheduler/backend"
	"inferd/store"
)

// meter is a backend.TokenMeter that keeps what it heard.
type meter struct{ got []store.Tokens }

func (m *meter) Tokens(t store.Tokens) { m.got = append(m.got, t) }

func openaiClient(t *testing.T, h http.HandlerFunc) *Client {
	t.Helper()
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	c, err := New(Config{Protocol: store.ProtocolOpenAI, Addr: strings.TrimPrefix(srv.URL, "http://")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// An OpenAI server's chunks reach the call's Stream one by one as they are
// sent, [DONE] ends the stream and is not a chunk, and the last usage
// reaches the meter.
func TestOpenAIStreamPassesEachChunkAsItComes(t *testing.T) {
	gate := make(chan struct{})
	var path string
	c := openaiClient(t, func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}],\"usage\":null}\n\n")
		w.(http.Flusher).Flush()
		<-gate // the rest only once the test has seen the first chunk
		io.WriteString(w, ": keep-alive\n\ndata: {\"choices\":[],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n")
	})
	s := &lines{got: make(chan string, 4)}
	m := &meter{}
	type result struct {
		out json.RawMessage
		err error
	}
	res := make(chan result, 1)
	go func() {
		out, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{"stream":true}`), Route: "/v1/completions", Stream: s, Meter: m})
		res <- result{out, err}
	}()
	if first := <-s.got; first != `{"choices":[{"delta":{"content":"a"}}],"usage":null}` {
		t.Fatalf("first chunk %s", first)
	}
	close(gate)
	r := <-res
	if r.err != nil || string(r.out) != `[{"choices":[{"delta":{"content":"a"}}],"usage":null},{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}]` {
		t.Fatalf("Infer = %s, %v; want the array of the chunks", r.out, r.err)
	}
	if path != "/v1/completions" {
		t.Errorf("posted to %s, want the call's route", path)
	}
	if len(m.got) != 1 || m.got[0] != (store.Tokens{Prompt: 3, Completion: 1}) {
		t.Errorf("meter heard %+v", m.got)
	}
}

// A whole reply's usage reaches the meter; a call without a route goes to
// the project's inferPath (/v1/chat/completions by default).
func TestOpenAIReplyUsageIsMetered(t *testing.T) {
	var path string
	c := openaiClient(t, func(w http.ResponseWriter, r *http.Request) {
		path = r.URL.Path
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"object":"chat.completion","usage":{"prompt_tokens":9,"completion_tokens":4,"total_tokens":13}}`)
	})
	m := &meter{}
	if _, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`), Meter: m}); err != nil {
		t.Fatal(err)
	}
	if path != store.OpenAIInferPath || len(m.got) != 1 || m.got[0] != (store.Tokens{Prompt: 9, Completion: 4}) {
		t.Errorf("path %s, meter %+v", path, m.got)
	}
}

// A chunk that is not JSON fails the call as an invalid reply; an error
// status is an HTTPError with the server's body.
func TestOpenAIBadChunkAndErrorStatus(t *testing.T) {
	c := openaiClient(t, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/v1/embeddings" {
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"error":{"message":"too long"}}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"a\":1}\n\ndata: oops\n\n")
	})
	_, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)})
	if !errors.Is(err, backend.ErrInvalidReply) || !strings.Contains(err.Error(), "streamed event 2 is not JSON") {
		t.Errorf("bad chunk: %v", err)
	}
	_, err = c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`), Route: "/v1/embeddings"})
	var he *backend.HTTPError
	if !errors.As(err, &he) || he.Status != 400 || he.Body != `{"error":{"message":"too long"}}` {
		t.Errorf("error status: %v", err)
	}
}
