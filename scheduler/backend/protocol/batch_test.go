package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"

	"inferd/scheduler/backend"
)

// batchModel answers a batch with reply, after checking that it got the
// batch protocol's request on path.
func batchModel(t *testing.T, path string, reply func(batch []json.RawMessage) string) *Client {
	t.Helper()
	p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Batch []json.RawMessage }
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != path || r.Header.Get("Content-Type") != "application/json" || json.Unmarshal(body, &req) != nil {
			t.Errorf("model got %s %s (%s) %s; want a batch POSTed to %s", r.Method, r.URL.Path, r.Header.Get("Content-Type"), body, path)
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, reply(req.Batch))
	})
	p.cfg.BatchPath = path
	return p
}

func inputs(vals ...string) []json.RawMessage {
	out := make([]json.RawMessage, len(vals))
	for i, v := range vals {
		out[i] = json.RawMessage(v)
	}
	return out
}

func TestInferBatchSendsTheBatchAndSplitsItsOutputsInOrder(t *testing.T) {
	var sent string
	p := batchModel(t, "/batch", func(batch []json.RawMessage) string {
		var parts []string
		for _, in := range batch {
			parts = append(parts, string(in))
		}
		sent = strings.Join(parts, " ")
		// The second item fails alone; the third is an output that happens
		// to have an error member beside others.
		return `{"outputs": [{"y": 1}, {"error": "bad image"}, {"error": "none", "y": 3}, [4]]}`
	})
	items, err := p.InferBatch(context.Background(), inputs(`{"x":1}`, `{"x":2}`, `{"x":3}`, `{"x":4}`))
	if err != nil {
		t.Fatalf("InferBatch: %v", err)
	}
	if sent != `{"x":1} {"x":2} {"x":3} {"x":4}` {
		t.Errorf("the model got the batch %s", sent)
	}
	want := []backend.BatchItem{
		{Output: json.RawMessage(`{"y": 1}`)},
		{Err: "bad image"},
		{Output: json.RawMessage(`{"error": "none", "y": 3}`)},
		{Output: json.RawMessage(`[4]`)},
	}
	if len(items) != len(want) {
		t.Fatalf("items = %+v, want %+v", items, want)
	}
	for i := range want {
		if string(items[i].Output) != string(want[i].Output) || items[i].Err != want[i].Err {
			t.Errorf("item %d = {%s %q}, want {%s %q}", i, items[i].Output, items[i].Err, want[i].Output, want[i].Err)
		}
	}
}

func TestInferBatchFailsTheWholeBatchOnABadReply(t *testing.T) {
	for _, tc := range []struct {
		name, reply, want string
	}{
		{"too few outputs", `{"outputs": [1]}`, "invalid reply from model: 1 outputs for 2 inputs"},
		{"too many outputs", `{"outputs": [1, 2, 3]}`, "invalid reply from model: 3 outputs for 2 inputs"},
		{"no outputs list", `{"output": [1, 2]}`, `invalid reply from model: a batch reply must be {"outputs": [...]}, got "{\"output\": [1, 2]}"`},
		{"outputs not a list", `{"outputs": 2}`, `a batch reply must be {"outputs": [...]}`},
		{"a bare list", `[1, 2]`, `a batch reply must be {"outputs": [...]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := batchModel(t, "/", func([]json.RawMessage) string { return tc.reply })
			_, err := p.InferBatch(context.Background(), inputs(`1`, `2`))
			if !errors.Is(err, backend.ErrInvalidReply) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("InferBatch: %v, want ErrInvalidReply saying %q", err, tc.want)
			}
		})
	}
}

func TestInferBatchPassesTheModelsHTTPErrorOn(t *testing.T) {
	p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "out of memory", http.StatusInternalServerError)
	})
	_, err := p.InferBatch(context.Background(), inputs(`1`, `2`))
	var he *backend.HTTPError
	if !errors.As(err, &he) || he.Status != 500 || he.Body != "out of memory\n" {
		t.Fatalf("InferBatch: %v, want the model's HTTP 500", err)
	}
}

func TestInferBatchRefusesAStreamedReply(t *testing.T) {
	p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, "{\"outputs\": [1]}\n")
	})
	_, err := p.InferBatch(context.Background(), inputs(`1`))
	if !errors.Is(err, backend.ErrInvalidReply) || !strings.Contains(err.Error(), "a batch reply must be one JSON object, not a stream") {
		t.Fatalf("InferBatch: %v", err)
	}
}

func TestItemErrorTellsAnErrorFromAnOutput(t *testing.T) {
	long := strings.Repeat("é", 600) // 1200 bytes: cut at 1 KiB, on a character boundary
	for in, want := range map[string]string{
		`{"error": "bad"}`:              "bad",
		` { "error" : "" } `:            "",
		`{"error": "` + long + `"}`:     strings.Repeat("é", 512),
		`{"error": 3}`:                  "(output)",
		`{"error": "bad", "detail": 1}`: "(output)",
		`{"detail": 1, "error": "bad"}`: "(output)",
		`{"error": {"message": "bad"}}`: "(output)",
		`"error"`:                       "(output)",
		`["error"]`:                     "(output)",
		`{}`:                            "(output)",
		`null`:                          "(output)",
	} {
		got, ok := itemError(json.RawMessage(in))
		if !ok {
			got = "(output)"
		}
		if got != want {
			t.Errorf("itemError(%.40s) = %.40q, want %.40q", in, got, want)
		}
	}
}

func TestNewTakesTheBatchPathOrTheInferPath(t *testing.T) {
	for _, tc := range []struct{ infer, batch, want string }{
		{"", "", "/"},
		{"/predict", "", "/predict"},
		{"/predict", "/predict_batch", "/predict_batch"},
	} {
		c, err := New(Config{InferPath: tc.infer, BatchPath: tc.batch, Addr: "127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		if c.cfg.BatchPath != tc.want {
			t.Errorf("inferPath %q batchPath %q: batches go to %q, want %q", tc.infer, tc.batch, c.cfg.BatchPath, tc.want)
		}
	}
	if _, err := New(Config{BatchPath: "batch"}); err == nil || !strings.Contains(err.Error(), "batch path") {
		t.Errorf("New with a relative batch path = %v", err)
	}
}
