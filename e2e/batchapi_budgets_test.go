package e2e

// The Batch API's budgets against the real binary (issue 41): what a
// batch's input, records, files and calls may hold. The memory they bound
// at full scale is measured by bench/batchbudget (docs/benchmarks.md).

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// llmDaemon starts inferd with config added to its configuration, and
// examples/echo as project llm of team acme, of protocol openai, with
// project's fields added (", minReplicas: 1"); it returns the daemon, a
// key of acme and the key's Authorization header.
func llmDaemon(t *testing.T, config, project string) (*daemon, string, map[string]string) {
	t.Helper()
	d, key, auth, _, _ := llmDaemonDir(t, config, project)
	return d, key, auth
}

// llmDaemonDir is llmDaemon that also returns the daemon's directory and
// config, to start it again.
func llmDaemonDir(t *testing.T, config, project string) (d *daemon, key string, auth map[string]string, dir, cfg string) {
	t.Helper()
	dir, cfg = newDaemonDir(t, config)
	d = startDaemon(t, dir, cfg)
	key = d.createKey("acme", false)
	d.apply(fmt.Sprintf("projects:\n  - {id: llm, team: acme, modelKey: mk-llm, command: [\"python3\", \"server.py\"], dir: %s, %s%s}\n", echoDir(t), openaiEcho, project))
	return d, key, map[string]string{"Authorization": "Bearer " + key}, dir, cfg
}

// uploadBatchFile uploads content as a Batch API file with key and returns
// the answer's status and body.
func uploadBatchFile(t *testing.T, d *daemon, key, content string) (int, map[string]any) {
	t.Helper()
	var form bytes.Buffer
	mw := multipart.NewWriter(&form)
	_ = mw.WriteField("purpose", "batch")
	fw, _ := mw.CreateFormFile("file", "in.jsonl")
	_, _ = io.WriteString(fw, content)
	_ = mw.Close()
	return do(t, "POST", d.base+"/v1/files", map[string]string{"Authorization": "Bearer " + key, "Content-Type": mw.FormDataContentType()}, form.String())
}

// uploadedBatchFile is uploadBatchFile that must succeed: the file's id.
func uploadedBatchFile(t *testing.T, d *daemon, key, content string) string {
	t.Helper()
	status, f := uploadBatchFile(t, d, key, content)
	if status != http.StatusOK {
		t.Fatalf("upload: %d %v", status, f)
	}
	return f["id"].(string)
}

// createBatchBody is POST /v1/batches' body for file, with extra fields
// (",\"metadata\": {...}") added.
func createBatchBody(file, extra string) string {
	return `{"input_file_id":"` + file + `","endpoint":"/v1/chat/completions","completion_window":"24h"` + extra + `}`
}

// chatBatchLine is a line of a batch file calling model with body fields
// (`"sleep": 1`) added.
func chatBatchLine(id, model, fields string) string {
	if fields != "" {
		fields = "," + fields
	}
	return fmt.Sprintf(`{"custom_id":%q,"method":"POST","url":"/v1/chat/completions","body":{"model":%q,"messages":[]%s}}`+"\n", id, model, fields)
}

// errorOf is the OpenAI error of an answer: its code, param and message.
func errorOf(answer map[string]any) (code, param, msg string) {
	e, _ := answer["error"].(map[string]any)
	code, _ = e["code"].(string)
	param, _ = e["param"].(string)
	msg, _ = e["message"].(string)
	return code, param, msg
}

// TestABatchLineIsHeldToMaxBodyBytesAsADirectPostIs: a line whose body is
// over maxBodyBytes is refused at creation, naming the line and the
// setting, as the same body posted to /v1/chat/completions gets 413 (issue
// 41: 31 MB reached the model); and several creates at once of such a
// file, one key, are each answered (refused as too large, or 429 with
// Retry-After for openai.createsPerTeam), none cut without an answer.
func TestABatchLineIsHeldToMaxBodyBytesAsADirectPostIs(t *testing.T) {
	t.Parallel()
	d, key, auth := llmDaemon(t, "maxBodyBytes: 65536\n", "")

	pad := `"pad": "` + strings.Repeat("x", 1<<20) + `"`
	file := uploadedBatchFile(t, d, key, chatBatchLine("small", "llm", "")+chatBatchLine("big", "llm", pad))
	status, answer := do(t, "POST", d.base+"/v1/batches", auth, createBatchBody(file, ""))
	if _, _, msg := errorOf(answer); status != http.StatusBadRequest || !strings.Contains(msg, "line 2") || !strings.Contains(msg, "maxBodyBytes") {
		t.Errorf("create of a file whose line 2 is over maxBodyBytes: %d %v, want 400 naming line 2 and maxBodyBytes", status, answer)
	}
	body := `{"model": "llm", "messages": [], ` + pad + `}`
	if status, answer := do(t, "POST", d.base+"/v1/chat/completions", auth, body); status != http.StatusRequestEntityTooLarge {
		t.Errorf("the same body posted directly: %d %v, want 413", status, answer)
	}

	// Eight creates at once of a file of one 8 MiB line.
	huge := uploadedBatchFile(t, d, key, chatBatchLine("huge", "llm", `"pad": "`+strings.Repeat("x", 8<<20)+`"`))
	type result struct {
		status     int
		retryAfter string
		answer     string
		err        error
	}
	results := make([]result, 8)
	var wg sync.WaitGroup
	for i := range results {
		wg.Go(func() {
			req, _ := http.NewRequest("POST", d.base+"/v1/batches", strings.NewReader(createBatchBody(huge, "")))
			req.Header.Set("Authorization", "Bearer "+key)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				results[i].err = err
				return
			}
			defer resp.Body.Close()
			raw, err := io.ReadAll(resp.Body)
			results[i] = result{resp.StatusCode, resp.Header.Get("Retry-After"), string(raw), err}
		})
	}
	wg.Wait()
	busy := 0
	for i, r := range results {
		var a map[string]any
		_ = json.Unmarshal([]byte(r.answer), &a)
		code, _, msg := errorOf(a)
		switch {
		case r.err != nil:
			t.Errorf("create %d: no answer: %v", i, r.err)
		case r.status == http.StatusBadRequest && strings.Contains(msg, "maxBodyBytes"):
		case r.status == http.StatusTooManyRequests && code == "too_many_creates" && r.retryAfter != "" && strings.Contains(msg, "openai.createsPerTeam"):
			busy++
		default:
			t.Errorf("create %d: %d (Retry-After %q) %s, want 400 naming maxBodyBytes or 429 naming openai.createsPerTeam", i, r.status, r.retryAfter, r.answer)
		}
	}
	// Each refusal is counted under its budget (the series is there at 0
	// when none was refused).
	if n, ok := scrapeMetrics(t, d.base)[`inferd_budget_refusals_total{budget="openai.createsPerTeam"}`]; !ok || int(n) != busy {
		t.Errorf("inferd_budget_refusals_total for openai.createsPerTeam: %v (present %v), want %d", n, ok, busy)
	}
}

// TestBatchRecordsAndFilesHaveBudgets: metadata is held to OpenAI's bounds
// (issue 41: 100 batches of 9.4 MiB metadata took 1.77 GB), a batch's
// output and error files stay within openai.maxTeamFileBytes (21 MB were
// written against 4 MiB), and a team's files are counted, empty uploads
// included (10,000 were made in 92 s).
func TestBatchRecordsAndFilesHaveBudgets(t *testing.T) {
	t.Parallel()
	const teamBytes = 48 << 10
	d, key, auth := llmDaemon(t, fmt.Sprintf("openai:\n  maxFileBytes: %d\n  maxTeamFileBytes: %d\n  maxFilesPerTeam: 6\n", 32<<10, teamBytes), "")

	// 150 lines of ~200 bytes; echo answers each with its body, so the
	// results (~300 bytes a line) pass the team's bytes with the input.
	var in strings.Builder
	for i := range 150 {
		in.WriteString(chatBatchLine(fmt.Sprint("r", i), "llm", `"pad": "`+strings.Repeat("p", 100)+`"`))
	}
	file := uploadedBatchFile(t, d, key, in.String())
	for name, md := range map[string]string{
		"17 pairs":              `{"a":"","b":"","c":"","d":"","e":"","f":"","g":"","h":"","i":"","j":"","k":"","l":"","m":"","n":"","o":"","p":"","q":""}`,
		"a 65-character key":    `{"` + strings.Repeat("k", 65) + `": "v"}`,
		"a 513-character value": `{"k": "` + strings.Repeat("v", 513) + `"}`,
	} {
		status, answer := do(t, "POST", d.base+"/v1/batches", auth, createBatchBody(file, `,"metadata":`+md))
		if _, param, _ := errorOf(answer); status != http.StatusBadRequest || param != "metadata" {
			t.Errorf("metadata with %s: %d %v, want 400 on metadata", name, status, answer)
		}
	}
	status, batch := do(t, "POST", d.base+"/v1/batches", auth, createBatchBody(file, `,"metadata":{"k":"`+strings.Repeat("v", 512)+`"}`))
	if status != http.StatusOK {
		t.Fatalf("create: %d %v", status, batch)
	}
	id := batch["id"].(string)
	eventually(t, 2*time.Minute, "the batch to end", func() bool {
		_, batch = do(t, "GET", d.base+"/v1/batches/"+id, auth, "")
		return batch["status"] == "completed"
	})
	counts := batch["request_counts"].(map[string]any)
	if counts["completed"].(float64) == 0 || counts["failed"].(float64) == 0 {
		t.Errorf("counts %v, want some lines completed and those whose results did not fit failed", counts)
	}
	var list struct {
		Data []struct {
			ID    string `json:"id"`
			Bytes int64  `json:"bytes"`
		} `json:"data"`
	}
	_, raw := doRaw(t, "GET", d.base+"/v1/files", auth, "")
	if err := json.Unmarshal(raw, &list); err != nil {
		t.Fatal(err)
	}
	var held int64
	for _, f := range list.Data {
		held += f.Bytes
	}
	if held > teamBytes {
		t.Errorf("the team's files hold %d bytes, past openai.maxTeamFileBytes %d", held, teamBytes)
	}
	if eid, _ := batch["error_file_id"].(string); eid != "" {
		_, content := doRaw(t, "GET", d.base+"/v1/files/"+eid+"/content", auth, "")
		if !strings.Contains(string(content), "openai.maxTeamFileBytes") {
			t.Errorf("the error file does not name openai.maxTeamFileBytes: %.300s", content)
		}
	} else if !strings.Contains(fmt.Sprint(batch["errors"]), "openai.maxTeamFileBytes") {
		t.Errorf("no error file, and the batch's errors %v do not name openai.maxTeamFileBytes", batch["errors"])
	}

	// Empty uploads count: up to 6 files in all, then refused.
	n := len(list.Data)
	for ; n < 6; n++ {
		uploadedBatchFile(t, d, key, "")
	}
	status, answer := uploadBatchFile(t, d, key, "")
	if code, _, msg := errorOf(answer); status != http.StatusBadRequest || code != "file_count_budget" || !strings.Contains(msg, "openai.maxFilesPerTeam") {
		t.Errorf("a seventh file: %d %v, want 400 file_count_budget naming openai.maxFilesPerTeam", status, answer)
	}
}

// TestInteractiveCallsGetThroughWhileBatchesFillTheProject: three batches
// of one project whose lines each take a while, against a queue of 4
// (issue 41: several batches together filled the project's queue and
// interactive requests got 429 queue_full). The batches together keep at
// most half of the queue, so interactive requests, two at a time, are
// queued and answered, never refused; the batches complete.
func TestInteractiveCallsGetThroughWhileBatchesFillTheProject(t *testing.T) {
	t.Parallel()
	d, key, auth := llmDaemon(t, "maxQueuedPerProject: 4\n", ", minReplicas: 1, maxReplicas: 1")

	var in strings.Builder
	for i := range 8 {
		in.WriteString(chatBatchLine(fmt.Sprint("r", i), "llm", `"sleep": 0.3`))
	}
	var ids []string
	for range 3 {
		file := uploadedBatchFile(t, d, key, in.String())
		status, b := do(t, "POST", d.base+"/v1/batches", auth, createBatchBody(file, ""))
		if status != http.StatusOK {
			t.Fatalf("create: %d %v", status, b)
		}
		ids = append(ids, b["id"].(string))
	}
	eventually(t, time.Minute, "the batches' lines to queue", func() bool {
		return scrapeMetrics(t, d.base)[`inferd_queue_depth{project="llm"}`] >= 1
	})
	for round := range 3 {
		var wg sync.WaitGroup
		for i := range 2 {
			wg.Go(func() {
				status, raw, err := tryDoRaw("POST", d.base+"/v1/chat/completions", auth, `{"model": "llm", "messages": [], "n": 1}`)
				if err != nil || status != http.StatusOK {
					t.Errorf("interactive request %d of round %d while batches run: %d %s %v", i, round, status, raw, err)
				}
			})
		}
		wg.Wait()
	}
	for _, id := range ids {
		eventually(t, 2*time.Minute, "batch "+id+" to complete", func() bool {
			_, b := do(t, "GET", d.base+"/v1/batches/"+id, auth, "")
			return b["status"] == "completed" && b["request_counts"].(map[string]any)["completed"] == 8.0
		})
	}
}

// TestAnEndedBatchStaysAsItEndedAcrossARestart: a cancelled batch and a
// completed one read the same after a restart (status, counts, metadata,
// files), listed as before; the daemon holds ended batches as index
// entries and reads their records from disk when asked (issue 41: every
// record was read back into memory at start).
func TestAnEndedBatchStaysAsItEndedAcrossARestart(t *testing.T) {
	t.Parallel()
	d, key, auth, dir, cfg := llmDaemonDir(t, "", ", minReplicas: 1, maxReplicas: 1")
	create := func(content string) string {
		file := uploadedBatchFile(t, d, key, content)
		status, b := do(t, "POST", d.base+"/v1/batches", auth, createBatchBody(file, `,"metadata":{"run":"`+strings.Repeat("é", 512)+`"}`))
		if status != http.StatusOK {
			t.Fatalf("create: %d %v", status, b)
		}
		return b["id"].(string)
	}
	ended := func(id string) map[string]any {
		var b map[string]any
		eventually(t, 2*time.Minute, "batch "+id+" to end", func() bool {
			_, b = do(t, "GET", d.base+"/v1/batches/"+id, auth, "")
			return b["status"] == "completed" || b["status"] == "cancelled"
		})
		return b
	}
	completed := create(chatBatchLine("a", "llm", "") + chatBatchLine("b", "llm", ""))
	var slow strings.Builder
	for i := range 20 {
		slow.WriteString(chatBatchLine(fmt.Sprint("s", i), "llm", `"sleep": 1`))
	}
	cancelled := create(slow.String())
	if status, b := do(t, "POST", d.base+"/v1/batches/"+cancelled+"/cancel", auth, ""); status != http.StatusOK {
		t.Fatalf("cancel: %d %v", status, b)
	}
	before := map[string]map[string]any{completed: ended(completed), cancelled: ended(cancelled)}
	if before[cancelled]["status"] != "cancelled" {
		t.Fatalf("the cancelled batch ended %v", before[cancelled]["status"])
	}
	_, listBefore := doRaw(t, "GET", d.base+"/v1/batches", auth, "")

	d.stop()
	d = startDaemon(t, dir, cfg)
	for id, want := range before {
		_, got := do(t, "GET", d.base+"/v1/batches/"+id, auth, "")
		for _, field := range []string{"status", "request_counts", "metadata", "output_file_id", "error_file_id", "cancelled_at", "completed_at"} {
			if fmt.Sprint(got[field]) != fmt.Sprint(want[field]) {
				t.Errorf("batch %s's %s after the restart: %v, want %v", id, field, got[field], want[field])
			}
		}
	}
	if _, listAfter := doRaw(t, "GET", d.base+"/v1/batches", auth, ""); string(listAfter) != string(listBefore) {
		t.Errorf("the list after the restart:\n%s\nwant\n%s", listAfter, listBefore)
	}
	if out, _ := before[completed]["output_file_id"].(string); out != "" {
		if status, content := doRaw(t, "GET", d.base+"/v1/files/"+out+"/content", auth, ""); status != http.StatusOK || strings.Count(string(content), "\n") != 2 {
			t.Errorf("the completed batch's output after the restart: %d %s", status, content)
		}
	}
}
