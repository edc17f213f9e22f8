package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// openaiAnswer is one answer of the OpenAI door: its status, headers and
// the error of an error body (nil for another body).
type openaiAnswer struct {
	status int
	header http.Header
	body   string
	err    map[string]any
}

func openaiDo(t *testing.T, method, url, key, body string) openaiAnswer {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(2*time.Minute))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	a := openaiAnswer{status: resp.StatusCode, header: resp.Header, body: string(raw)}
	var e struct {
		Error map[string]any `json:"error"`
	}
	if json.Unmarshal(raw, &e) == nil {
		a.err = e.Error
	}
	return a
}

// isOpenAIError reports whether a is an error in OpenAI's shape with
// status and code (code "" for any).
func (a openaiAnswer) isOpenAIError(status int, code string) bool {
	if a.status != status || a.err == nil {
		return false
	}
	for _, f := range []string{"message", "type", "param", "code"} {
		if _, ok := a.err[f]; !ok {
			return false
		}
	}
	return code == "" || a.err["code"] == code
}

// TestOpenAIDoorPromises drives the OpenAI door's promises through the real
// binary and examples/openai-mock over HTTP: a model's name resolves for
// GET /v1/models/{model} as for a request; routes and methods that do not
// exist answer in OpenAI's shape; the model's 429 and 503 reach the client
// with their Retry-After unchanged; a call cancelled through /cancel/v4 is
// answered with a status and header no OpenAI client retries, and the
// cancel says "cancelled"; a stream whose client leaves is recorded as
// disconnected, not cancelled by request; the team's own project of
// another protocol, named as a model, says how to call it.
func TestOpenAIDoorPromises(t *testing.T) {
	t.Parallel()
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3 on PATH: examples/openai-mock needs it")
	}
	mock, _ := filepath.Abs("examples/openai-mock")
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("llm", false)
	d.apply("projects:\n" + openaiProject("chat", "llm", mock, "", "    aliases: [org/chat]\n    minReplicas: 1\n    concurrency: 4\n") +
		"  - {id: plain, team: llm, modelKey: mk-plain, command: [\"python3\", \"server.py\"], dir: " + echo + ", env: {E2E_MARKER: " + marker() + "}}\n")
	base := d.base

	t.Run("a model resolves as a request would", func(t *testing.T) {
		for _, name := range []string{"chat", "org/chat"} {
			a := openaiDo(t, "GET", base+"/v1/models/"+name, key, "")
			var m map[string]any
			if json.Unmarshal([]byte(a.body), &m); a.status != 200 || m["id"] != name || m["object"] != "model" {
				t.Errorf("GET /v1/models/%s: %d %s", name, a.status, a.body)
			}
		}
		if a := openaiDo(t, "GET", base+"/v1/models/nope", key, ""); !a.isOpenAIError(404, "model_not_found") {
			t.Errorf("an unknown model: %d %s", a.status, a.body)
		}
	})
	t.Run("what does not exist answers in OpenAI's shape", func(t *testing.T) {
		if a := openaiDo(t, "GET", base+"/v1/chat/nothing", key, ""); !a.isOpenAIError(404, "") {
			t.Errorf("an unknown route: %d %s", a.status, a.body)
		}
		if a := openaiDo(t, "PUT", base+"/v1/chat/completions", key, "{}"); !a.isOpenAIError(405, "") {
			t.Errorf("a method the route does not answer: %d %s", a.status, a.body)
		}
		for _, path := range []string{"/v1/files", "/v1/batches"} {
			a := openaiDo(t, "GET", base+path, key, "")
			if a.status != 200 || !strings.Contains(a.body, `"object":"list"`) || !strings.Contains(a.body, `"has_more":false`) {
				t.Errorf("GET %s: %d %s", path, a.status, a.body)
			}
		}
	})
	t.Run("the model's Retry-After passes on unchanged", func(t *testing.T) {
		for _, tc := range []struct {
			status int
			after  string
		}{{429, "7"}, {503, "3"}} {
			a := openaiDo(t, "POST", base+"/v1/chat/completions", key,
				`{"model":"chat","messages":[{"role":"user","content":"x"}],"mock_status":`+strconv.Itoa(tc.status)+`,"mock_retry_after":"`+tc.after+`"}`)
			// The model's own error (vLLM's shape: its message, a numeric
			// code OpenAI's clients do not read) in OpenAI's shape.
			if !a.isOpenAIError(tc.status, "") || !strings.Contains(a.body, "mock failure") || a.header.Get("Retry-After") != tc.after {
				t.Errorf("the model's %d: %d Retry-After %q %s", tc.status, a.status, a.header.Get("Retry-After"), a.body)
			}
			if strings.Contains(a.body, "127.0.0.1") || strings.Contains(a.body, "error: ") {
				t.Errorf("the answer carries inferd's own text: %s", a.body)
			}
		}
	})
	t.Run("a cancel is final in every client", func(t *testing.T) {
		id, stop := holdStream(t, base, key)
		defer stop()
		status, ans := do(t, "POST", base+"/cancel/v4", nil, `{"apiKey":"`+key+`","callID":"`+id+`"}`)
		if status != 200 || ans["message"] != "cancelled" || ans["modelOutputs"] != nil {
			t.Fatalf("the cancel's answer: %d %v", status, ans)
		}
		a := openaiDo(t, "GET", base+"/v1/calls/"+id+"/response", key, "")
		// openai-node, the AI SDK and LangChain retry 408, 409, 429 and 5xx
		// (LangChain all but 400-407 and 409); x-should-retry: false is
		// read by openai-node before any status.
		if !a.isOpenAIError(400, "cancelled") || a.header.Get("X-Should-Retry") != "false" {
			t.Errorf("the cancelled call: %d x-should-retry %q %s", a.status, a.header.Get("X-Should-Retry"), a.body)
		}
	})
	t.Run("a stream's client that leaves is disconnected, not cancelled by request", func(t *testing.T) {
		id, stop := holdStream(t, base, key)
		stop()
		var message string
		eventually(t, 30*time.Second, "the stream's call to end", func() bool {
			_, ans := do(t, "POST", base+"/check/v4", nil, `{"apiKey":"`+key+`","callID":"`+id+`"}`)
			message, _ = ans["message"].(string)
			return ans["finished"] == true
		})
		if message != "error: cancelled: the client disconnected" {
			t.Errorf("the call ended %q", message)
		}
	})
	t.Run("a project of another protocol named as a model says how to call it", func(t *testing.T) {
		a := openaiDo(t, "POST", base+"/v1/chat/completions", key, `{"model":"plain","messages":[]}`)
		if !a.isOpenAIError(400, "model_not_supported") || !strings.Contains(a.body, "/run/plain/") {
			t.Errorf("%d %s", a.status, a.body)
		}
	})
}

// holdStream opens a stream that the mock holds open after its first
// chunk and returns its call's id, read from the answer's header, and the
// function that closes the client's side.
func holdStream(t *testing.T, base, key string) (id string, stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, err := http.NewRequestWithContext(ctx, "POST", base+"/v1/chat/completions",
		strings.NewReader(`{"model":"chat","stream":true,"mock_hold":true,"messages":[{"role":"user","content":"hold it"}]}`))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		cancel()
		t.Fatalf("the stream: HTTP %d", resp.StatusCode)
	}
	// The first chunk has come: the call runs at the model.
	if _, err := bufio.NewReader(resp.Body).ReadString('\n'); err != nil {
		cancel()
		t.Fatalf("the stream's first chunk: %v", err)
	}
	return resp.Header.Get("X-Inferd-Call-Id"), func() { cancel(); resp.Body.Close() }
}
