package httpapi

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	vm "github.com/VictoriaMetrics/metrics"
	"github.com/rs/zerolog"

	"inferd/batches"
	"inferd/httpapi/metrics"
	"inferd/store"
)

// batchEnv is newEnv with a Batch API in a directory of its own (returned)
// and echo and zeta served as OpenAI models.
func batchEnv(t *testing.T, opts Options) (*testEnv, string) {
	dir := t.TempDir()
	bm, err := batches.New(batches.Config{Dir: dir, Log: zerolog.Nop()})
	if err != nil {
		t.Fatal(err)
	}
	opts.Batches = bm
	env := newEnv(t, opts)
	for _, p := range []string{"echo", "zeta"} {
		if _, err := env.store.UpdateProject(p, func(p *store.Project) error { p.Model.Protocol = store.ProtocolOpenAI; return nil }); err != nil {
			t.Fatal(err)
		}
	}
	return env, dir
}

// storedFiles counts the files the Batch API holds in dir.
func storedFiles(t *testing.T, dir string) int {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(dir, "files", "*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(paths)
}

// uploadHead is an upload's request line and headers (a Content-Length of
// n) and the form up to the file's content.
func uploadHead(key string, n int) string {
	return "POST /v1/files HTTP/1.1\r\nHost: inferd\r\nAuthorization: Bearer " + key + "\r\n" +
		"Content-Type: multipart/form-data; boundary=XB\r\nContent-Length: " + strconv.Itoa(n) + "\r\n\r\n" +
		"--XB\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
		"--XB\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n"
}

// An upload streams to disk, so what it holds of the body budgets is its
// buffers (uploadBufferBytes), counted while it is read: one more than the
// budget has room for is refused at once, naming limits.bodyBytes. A body
// announced larger than the file bound is refused before a byte of it is
// read, and one that stalls is cut at limits.bodyReadTimeout (408, the
// refusal counted); neither leaves a file.
func TestUploadsAreHeldToTheEdgeBudgets(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := metrics.New(vm.NewSet())
		env, dir := batchEnv(t, Options{Metrics: m, BatchFileBytes: 1 << 20,
			Limits: Limits{BodyBytes: uploadBufferBytes, BodyReadTimeout: 10 * time.Second}})
		ps := newPipeServer(t, env.h, 0)

		stalled := ps.dialFrom("192.0.2.1:1")
		stalled.send(uploadHead(keyAcme, 100<<10) + `{"custom_id":"a",`) // and no more
		synctest.Wait()
		if got := metricValue(t, m, "inferd_request_body_bytes"); got != uploadBufferBytes {
			t.Errorf("an upload under way holds %v bytes of the body budget, want %d", got, uploadBufferBytes)
		}

		second := ps.dialFrom("192.0.2.2:1")
		second.send(uploadHead(keyAcme, 1000))
		resp, answer := second.response()
		if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" || !strings.Contains(answer, "(limits.bodyBytes)") {
			t.Errorf("an upload past limits.bodyBytes: %d %s", resp.StatusCode, answer)
		}

		huge := ps.dialFrom("192.0.2.3:1")
		huge.send(uploadHead(keyAcme, 3<<20)[:strings.Index(uploadHead(keyAcme, 3<<20), "\r\n\r\n")+4]) // its headers only
		resp, answer = huge.response()
		if resp.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(answer, `"file_too_large"`) {
			t.Errorf("an upload announced past the file bound: %d %s", resp.StatusCode, answer)
		}

		time.Sleep(11 * time.Second) // the stalled upload's read deadline passes
		resp, answer = stalled.response()
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(answer, "(limits.bodyReadTimeout)") || !strings.Contains(answer, `"error":{`) {
			t.Errorf("a stalled upload: %d %s", resp.StatusCode, answer)
		}
		for _, budget := range []string{"limits.bodyBytes", "limits.bodyReadTimeout"} {
			if n := metricValue(t, m, `inferd_budget_refusals_total{budget="`+budget+`"}`); n != 1 {
				t.Errorf("%s refusals counted: %v", budget, n)
			}
		}
		if got := metricValue(t, m, "inferd_request_body_bytes"); got != 0 {
			t.Errorf("%v body bytes still held once no upload is under way", got)
		}
		if n := storedFiles(t, dir); n != 0 {
			t.Errorf("%d files stored of refused uploads", n)
		}
	})
}

// upload posts a batch file of content with key.
func upload(env *testEnv, key, content string) *httptest.ResponseRecorder {
	return serve(env.h, http.MethodPost, "/v1/files", uploadBody(content),
		"Content-Type", "multipart/form-data; boundary=XB", "Authorization", "Bearer "+key)
}

func uploadBody(content string) string {
	return "--XB\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n" +
		"--XB\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n" + content + "\r\n--XB--\r\n"
}

// A key limited to some projects runs no batch whose lines name another:
// it is told what it is told of a model that does not exist, and nothing
// is made; its own project's batch runs.
func TestAProjectLimitedKeyRunsNoBatchOfAnotherProject(t *testing.T) {
	env, _ := batchEnv(t, Options{})
	if err := env.store.AddKey(keyZetaOnly, store.APIKey{TeamID: "acme", Scope: store.ScopeTeam, KeyLimits: store.KeyLimits{Projects: []string{"zeta"}}}); err != nil {
		t.Fatal(err)
	}
	volatile := regexp.MustCompile(`file-[0-9a-f]+`)
	createFor := func(model string) (int, string) {
		line := `{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{"model":"` + model + `","messages":[]}}`
		rec := upload(env, keyZetaOnly, line)
		if rec.Code != http.StatusOK {
			t.Fatalf("upload: %d %s", rec.Code, rec.Body)
		}
		id := decode[batches.File](t, rec).ID
		rec = serve(env.h, http.MethodPost, "/v1/batches", `{"input_file_id":"`+id+`","endpoint":"/v1/chat/completions","completion_window":"24h"}`,
			"Authorization", "Bearer "+keyZetaOnly)
		return rec.Code, volatile.ReplaceAllString(strings.ReplaceAll(rec.Body.String(), model, "MODEL"), "")
	}
	otherStatus, other := createFor("echo")
	missingStatus, missing := createFor("nope")
	if otherStatus != http.StatusBadRequest || otherStatus != missingStatus || other != missing {
		t.Errorf("a batch of another project: %d %s\nof a model that does not exist: %d %s", otherStatus, other, missingStatus, missing)
	}
	if status, answer := createFor("zeta"); status != http.StatusOK {
		t.Errorf("a batch of its own project: %d %s", status, answer)
	}
}

// Without a Batch API its routes answer 404 to a key that may use them,
// and a key that may not is refused as everywhere.
func TestWithoutABatchAPIItsRoutesAnswer404(t *testing.T) {
	env := newScopedEnv(t)
	rec := serve(env.h, http.MethodGet, "/v1/batches/batch_x", "", "Authorization", "Bearer "+keyAcme)
	if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "does not serve the Batch API") {
		t.Errorf("with a key: %d %s", rec.Code, rec.Body)
	}
	rec = serve(env.h, http.MethodGet, "/v1/batches/batch_x", "", "Authorization", "Bearer "+keyReadOnly)
	if rec.Code != http.StatusForbidden {
		t.Errorf("with a read key: %d %s", rec.Code, rec.Body)
	}
}
