package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// openaiProject is a manifest entry of examples/openai-mock as a project of
// protocol openai serving model served-NAME.
func openaiProject(id, team, dir, env, extra string) string {
	return fmt.Sprintf(`  - id: %s
    team: %s
    modelKey: mk-%s
    command: ["python3", "server.py"]
    dir: %s
    protocol: openai
    servedModel: served-%s
    env: {MODEL_NAME: "served-%s", E2E_MARKER: "%s"%s}
%s`, id, team, id, dir, id, id, marker(), env, extra)
}

// openaiMockDir is examples/openai-mock's absolute path, once python3,
// which runs it, is known to be on PATH.
func openaiMockDir(t *testing.T) string {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3 on PATH: examples/openai-mock needs it")
	}
	mock, _ := filepath.Abs("examples/openai-mock")
	return mock
}

// npmInstalled is dir's absolute path, once each of pkgs is in its
// node_modules (make client-deps installs them); skip says which is not.
func npmInstalled(dir string, skip func(reason string), pkgs ...string) string {
	abs, _ := filepath.Abs(dir)
	for _, pkg := range pkgs {
		if _, err := os.Stat(filepath.Join(abs, "node_modules", pkg)); err != nil {
			skip(fmt.Sprintf("the npm package %s is not installed in %s/node_modules", pkg, dir))
		}
	}
	return abs
}

// TestOpenAIClient drives the OpenAI front door with the official openai
// npm client (examples/openai-js, pinned in its package-lock.json; `make
// test` installs it and sets INFERD_REQUIRE_CLIENT_TESTS=1, so there this
// test cannot skip) against examples/openai-mock: chat plain and streamed,
// completions, embeddings, model listing by team, a wrong key, an unknown
// model, a quota hit, a call that scales from zero, a client abort
// mid-stream (the model sees its request end), and a batch of 100 lines
// that survives a kill -9 of the daemon.
func TestOpenAIClient(t *testing.T) {
	t.Parallel()
	node, skip := clientTestTools(t)
	clients := npmInstalled("examples/openai-js", skip, "openai")
	mock := openaiMockDir(t)
	dir, cfg := newDaemonDir(t, "shutdownTimeout: 5s\n")
	d := startDaemon(t, dir, cfg)
	key, other, tight := d.createKey("llm", false), d.createKey("other", false), d.createKey("tight", false)
	d.apply("teams:\n  - {id: tight, quota: {queuedCalls: 1}}\nprojects:\n" +
		openaiProject("chat", "llm", mock, `, BOOT_SECONDS: "1"`, "    aliases: [my-llm]\n    concurrency: 4\n    maxReplicas: 2\n") +
		openaiProject("batchy", "llm", mock, "", "    retries: 2\n    maxReplicas: 1\n") +
		openaiProject("other-chat", "other", mock, "", "") +
		openaiProject("tight", "tight", mock, "", "    maxReplicas: 1\n"))

	run := func(args ...string) string {
		t.Helper()
		cmd := exec.Command(node, args...)
		cmd.Dir = clients
		cmd.Env = append(os.Environ(), "INFERD_BASE="+d.base, "INFERD_KEY="+key, "INFERD_OTHER_KEY="+other, "INFERD_TIGHT_KEY="+tight)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("node %s failed against inferd: %v\n%s", strings.Join(args, " "), err, out)
		}
		return string(out)
	}
	out := run("--test", "--test-reporter=spec", "openai.test.js")
	if !strings.Contains(out, "pass 9") {
		t.Fatalf("expected 9 passing client tests:\n%s", out)
	}
	// The aborted stream's request ended at the model too.
	eventually(t, 10*time.Second, "the model to see the aborted stream end", func() bool {
		logs, _ := d.cli("logs", "chat")
		return strings.Contains(logs, "stream aborted by the client")
	})
	// The tokens the model reported are counted, per team and project: in
	// the metrics and in the usage ledger, which the team's key reads.
	metrics := scrapeMetrics(t, d.base)
	if n := metrics[`inferd_tokens_total{team="llm",project="chat",kind="completion"}`]; n < 3 {
		t.Errorf("completion tokens of chat in /metrics: %v, want those of the calls made", n)
	}
	var ledger struct{ prompt, completion, wantPrompt, wantCompletion float64 }
	eventually(t, 10*time.Second, "the usage ledger to count chat's tokens as /metrics does", func() bool {
		var rep struct {
			Results []struct {
				ProjectID        string  `json:"projectId"`
				PromptTokens     float64 `json:"promptTokens"`
				CompletionTokens float64 `json:"completionTokens"`
			} `json:"results"`
		}
		_, body := doRaw(t, "GET", d.base+"/v1/usage?groupBy=project", map[string]string{"X-Service-API-Key": key}, "")
		if err := json.Unmarshal(body, &rep); err != nil {
			t.Fatalf("GET /v1/usage: %v in %s", err, body)
		}
		m := scrapeMetrics(t, d.base)
		ledger.wantPrompt = m[`inferd_tokens_total{team="llm",project="chat",kind="prompt"}`]
		ledger.wantCompletion = m[`inferd_tokens_total{team="llm",project="chat",kind="completion"}`]
		for _, r := range rep.Results {
			if r.ProjectID == "chat" {
				ledger.prompt, ledger.completion = r.PromptTokens, r.CompletionTokens
			}
		}
		return ledger.completion >= 3 && ledger.prompt == ledger.wantPrompt && ledger.completion == ledger.wantCompletion
	})
	t.Logf("chat's tokens in /v1/usage: %v prompt, %v completion", ledger.prompt, ledger.completion)

	// The batch: started, the daemon killed mid-way, restarted on the same
	// data dir; it completes with every line answered once, in order.
	var started struct {
		Batch     string `json:"batch"`
		Completed int    `json:"completed"`
	}
	startOut := run("batch.mjs", "start", "100")
	if err := json.Unmarshal([]byte(strings.TrimSpace(startOut[strings.LastIndex(strings.TrimSpace(startOut), "\n")+1:])), &started); err != nil || started.Batch == "" {
		t.Fatalf("batch start printed %q: %v", startOut, err)
	}
	d.kill()
	d = startDaemon(t, dir, cfg)
	if out := run("batch.mjs", "finish", started.Batch, "100"); !strings.Contains(out, "batch ok") {
		t.Fatalf("batch finish: %s", out)
	}
	t.Logf("batch %s: %d of 100 lines done at the kill", started.Batch, started.Completed)
}
