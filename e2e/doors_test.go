package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestEveryDoorRefusesTextThatIsNotUTF8: a request with a byte that is not
// UTF-8 is refused on every door that makes a call, as /start/v4 refuses
// it (docs/security.md; issue 41: the OpenAI routes and /run passed it to
// the model), naming the byte, before the model it names is looked for.
func TestEveryDoorRefusesTextThatIsNotUTF8(t *testing.T) {
	t.Parallel()
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	bad := "{\"model\":\"m\",\"prompt\":\"caf\xe9\",\"messages\":[{\"role\":\"user\",\"content\":\"x\"}],\"input\":\"x\"}"
	at := strings.Index(bad, "\xe9")
	for _, tc := range []struct {
		path    string
		headers map[string]string
		body    string
		status  int
	}{
		{"/v1/chat/completions", map[string]string{"Authorization": "Bearer " + key}, bad, 400},
		{"/v1/completions", map[string]string{"Authorization": "Bearer " + key}, bad, 400},
		{"/v1/embeddings", map[string]string{"Authorization": "Bearer " + key}, bad, 400},
		{"/run/nope/predict", map[string]string{"X-Banana-API-Key": key}, bad, 422},
		{"/start/v4", nil, fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk","modelInputs":{"x":"caf`+"\xe9"+`"}}`, key), 200},
	} {
		status, body := doRaw(t, "POST", d.base+tc.path, tc.headers, tc.body)
		want := "request body is not valid UTF-8 at byte "
		if tc.path != "/start/v4" {
			want += fmt.Sprint(at)
		}
		if status != tc.status || !strings.Contains(string(body), want) {
			t.Errorf("POST %s: %d %s; want %d naming the byte", tc.path, status, body, tc.status)
		}
	}
}

// TestTokenCountsAModelReportsCannotMakeTotalsGoDown: a model that reports
// huge or negative token counts (issue 41: two calls reporting
// 9223372036854775807 made a team's tokens read -2) is counted within
// [0, 2^53-1] per call, and the team's total in GET /v1/usage and
// inferd_tokens_total only grow.
func TestTokenCountsAModelReportsCannotMakeTotalsGoDown(t *testing.T) {
	t.Parallel()
	model, _ := filepath.Abs("e2e/testdata/usage_model.py")
	openaiMockDir(t) // python3
	dir, cfg := newDaemonDir(t, "")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply(fmt.Sprintf(`projects:
  - id: liar
    team: acme
    modelKey: mk-liar
    command: ["python3", %q]
    protocol: openai
    env: {E2E_MARKER: %q}
`, model, marker()))
	const maxTokens = 1<<53 - 1
	var last float64
	for i, usage := range []string{
		`{"prompt_tokens": 9223372036854775807, "completion_tokens": -5}`,
		`{"prompt_tokens": 9223372036854775807, "completion_tokens": 99999999999999999999999}`,
		`{"prompt_tokens": 1000, "completion_tokens": 1}`,
	} {
		content, _ := json.Marshal(usage)
		status, body := doRaw(t, "POST", d.base+"/v1/chat/completions", map[string]string{"Authorization": "Bearer " + key},
			`{"model":"liar","messages":[{"role":"user","content":`+string(content)+`}]}`)
		if status != http.StatusOK {
			t.Fatalf("call %d: %d %s", i, status, body)
		}
		var prompt float64
		eventually(t, 10*time.Second, "the usage ledger to count the call", func() bool {
			var rep struct {
				Results []struct {
					Calls            float64 `json:"calls"`
					PromptTokens     float64 `json:"promptTokens"`
					CompletionTokens float64 `json:"completionTokens"`
				} `json:"results"`
			}
			_, b := doRaw(t, "GET", d.base+"/v1/usage", map[string]string{"X-Service-API-Key": key}, "")
			if err := json.Unmarshal(b, &rep); err != nil || len(rep.Results) != 1 {
				return false
			}
			prompt = rep.Results[0].PromptTokens
			return rep.Results[0].Calls == float64(i+1)
		})
		if prompt < last || prompt < 0 {
			t.Errorf("after call %d the team's prompt tokens went from %v to %v", i, last, prompt)
		}
		last = prompt
	}
	if want := float64(2*maxTokens + 1000); last != want {
		t.Errorf("the team's prompt tokens = %v, want %v (each huge count clamped to 2^53-1)", last, want)
	}
	m := scrapeMetrics(t, d.base)
	if got := m[`inferd_tokens_total{team="acme",project="liar",kind="completion"}`]; got != maxTokens+1 {
		t.Errorf("inferd_tokens_total completion = %v, want %v (-5 as 0, the huge one clamped, then 1)", got, float64(maxTokens+1))
	}
}

// TestModelRepliesAreHeldWithinTheReplyBudget: with limits.replyBytes
// room for one 2 MB reply at a time, four calls of one project at
// concurrency 4 that each get one all succeed, their replies taken one
// after another (issue 41: one project at concurrency 16 with 60 MiB
// replies took the daemon to 1.55 GB); a reply larger than the whole
// budget fails its call with an error naming the setting, and the budget
// is all given back.
func TestModelRepliesAreHeldWithinTheReplyBudget(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, "limits:\n  replyBytes: 3000000\n")
	d := startDaemon(t, dir, cfg)
	key := d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, marker(), "") + "    concurrency: 4\n    maxReplicas: 1\n    minReplicas: 1\n")
	c := inferenceClient{t: t, base: d.base, key: key}
	if r := c.start("mk-echo", `{}`, false); r["message"] != "success" { // booted
		t.Fatalf("the first call: %v", r)
	}
	errs := make(chan error, 4)
	for i := range 4 {
		go func() {
			r, err := c.tryStart("mk-echo", fmt.Sprintf(`{"bytes": 2000000, "sleep": 0.5, "n": %d}`, i), false)
			if err == nil && r["message"] != "success" {
				err = fmt.Errorf("call %d: %v", i, r["message"])
			}
			errs <- err
		}()
	}
	for range 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	r := c.start("mk-echo", `{"bytes": 4000000}`, false)
	if want := "error: model replies being read and stored hold the 3000000 bytes they may (limits.replyBytes); retry later"; r["message"] != want {
		t.Errorf("a reply larger than the budget: %v; want %q", r["message"], want)
	}
	if got := scrapeMetrics(t, d.base)["inferd_model_reply_bytes"]; got != 0 {
		t.Errorf("inferd_model_reply_bytes = %v once every call ended, want 0", got)
	}
}
