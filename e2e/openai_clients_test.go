package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// clientCase is one line of examples/openai-clients/clients.mjs: a case
// one client ran, and the @ids of its requests that the model is to run
// once and never.
type clientCase struct {
	Client string `json:"client"`
	Case   string `json:"case"`
	OK     bool   `json:"ok"`
	Error  string `json:"error"`
	Skip   string `json:"skip"`
	Runs   struct {
		Once  []string `json:"once"`
		Never []string `json:"never"`
	} `json:"runs"`
	// Attempts are the HTTP requests the client made, as its fetch saw them.
	Attempts []struct {
		Status     int    `json:"status"`
		RetryAfter string `json:"retryAfter"`
	} `json:"attempts"`
}

// openaiClients are the npm clients examples/openai-clients drives, pinned
// in its package-lock.json: the openai client of the 4.x line and of the
// current major, the AI SDK with @ai-sdk/openai and with
// @ai-sdk/openai-compatible, and LangChain's @langchain/openai.
var openaiClients = []string{"openai4", "openai", "ai-sdk-openai", "ai-sdk-compatible", "langchain"}

// TestOpenAIClients drives each npm OpenAI client a team points at inferd
// (examples/openai-clients; `make test` installs them and sets
// INFERD_REQUIRE_CLIENT_TESTS=1, so there this test cannot skip) through
// the OpenAI door against examples/openai-mock, which answers as vLLM's
// server does: chat plain and streamed with and without include_usage,
// completions, tool calls plain and streamed, n=2, logprobs, embeddings
// (base64 where the client asks for it), vLLM's 400 error, a stream whose
// body ends 200 ms after its [DONE] followed at once by another call, a
// call and a stream cancelled through /cancel/v4 (neither sent again), a
// 429 with Retry-After: 1 (sent again after it), a 503 with
// Retry-After: 7 (which the client sees), a model that drops the
// connection (a 502 with no address or Go error in it), and GET
// /v1/models/ID, /v1/files and /v1/batches (the openai client). Each case must do what its user
// needs, and the model must run each request exactly once (the mock logs
// "run ID" for each: a client that sent a request again after a 502 or a
// cancel would run it twice). One inferd, one replica, one node process per
// client, the clients one after another.
func TestOpenAIClients(t *testing.T) {
	t.Parallel()
	node, skip := clientTestTools(t)
	dir := npmInstalled("examples/openai-clients", skip, "openai", "openai4", "ai", "@ai-sdk/openai", "@ai-sdk/openai-compatible", "@langchain/openai")
	mock := openaiMockDir(t)
	daemonDir, cfg := newDaemonDir(t, "shutdownTimeout: 5s\n")
	d := startDaemon(t, daemonDir, cfg)
	key := d.createKey("llm", false)
	d.apply("projects:\n" + openaiProject("vllm", "llm", mock, "", "    minReplicas: 1\n    maxReplicas: 1\n    concurrency: 8\n"))

	var cases []clientCase
	for _, client := range openaiClients {
		cases = append(cases, runClient(t, node, dir, client, "INFERD_BASE="+d.base, "INFERD_KEY="+key, "MODEL=vllm")...)
	}

	// The model's runs, by @id, from its log.
	logs, err := d.cli("logs", "vllm", "-n", "5000")
	if err != nil {
		t.Fatal(err)
	}
	runs := map[string]int{}
	for _, line := range strings.Split(logs, "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "run" {
			runs[f[1]]++
		}
	}
	for _, c := range cases {
		t.Run(c.Client+"/"+c.Case, func(t *testing.T) {
			if c.Skip != "" {
				t.Skipf("%s cannot express it: %s", c.Client, c.Skip)
			}
			if !c.OK {
				t.Errorf("%s\nattempts: %+v", c.Error, c.Attempts)
			}
			for _, id := range c.Runs.Once {
				if n := runs[id]; n != 1 {
					t.Errorf("the model ran request %s %d times, want once (attempts: %+v)", id, n, c.Attempts)
				}
			}
			for _, id := range c.Runs.Never {
				if n := runs[id]; n != 0 {
					t.Errorf("the model ran request %s %d times, want never", id, n)
				}
			}
		})
	}
}

// runClient runs clients.mjs for one client and returns its cases; the
// process must end by itself, each of its cases within its own deadline.
func runClient(t *testing.T, node, dir, client string, env ...string) []clientCase {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testenv.Scale(5*time.Minute))
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "clients.mjs", client)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), env...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node clients.mjs %s: %v (within 5 minutes?)\nstdout:\n%s\nstderr:\n%s", client, err, out, stderr.String())
	}
	var cases []clientCase
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
	for sc.Scan() {
		var c clientCase
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("node clients.mjs %s printed %q: %v", client, sc.Text(), err)
		}
		cases = append(cases, c)
	}
	if len(cases) == 0 {
		t.Fatalf("node clients.mjs %s ran no case:\n%s", client, stderr.String())
	}
	return cases
}
