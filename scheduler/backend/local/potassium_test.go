package local

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/scheduler/backend"
	"inferd/store"
)

// potassiumReply is what examples/potassium/app.py answers.
type potassiumReply struct {
	Echo      map[string]any `json:"echo"`
	Pid       int            `json:"pid"`
	Replica   string         `json:"replica"`
	RequestID string         `json:"request_id"`
}

// potassiumSpec returns a Spec running examples/potassium/app.py (an unmodified
// Potassium app on the framework's test double), or skips the test when python3 or
// Flask is missing.
func potassiumSpec(t *testing.T, id string) backend.Spec {
	t.Helper()
	py, err := python()
	if err != nil {
		t.Skipf("python3 is needed to run examples/potassium: %v", err)
	}
	if out, err := exec.Command(py, "-c", "import flask, werkzeug").CombinedOutput(); err != nil {
		t.Skipf("flask and werkzeug are needed to run examples/potassium: %v: %s", err, out)
	}
	app, err := filepath.Abs("../../../examples/potassium")
	if err != nil {
		t.Fatal(err)
	}
	return backend.Spec{
		ReplicaID: id,
		ProjectID: "proj-potassium",
		TeamID:    "team",
		Model:     store.ModelSpec{Command: []string{py, "app.py"}, Dir: app, Protocol: store.ProtocolPotassium},
	}
}

func potassiumInfer(t *testing.T, p *Process, inputs string) potassiumReply {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	out, err := p.Infer(ctx, json.RawMessage(inputs))
	if err != nil {
		t.Fatalf("Infer(%s): %v; last line %q", inputs, err, p.LastLogLine())
	}
	var r potassiumReply
	if err := json.Unmarshal(out, &r); err != nil {
		t.Fatalf("reply %s: %v", out, err)
	}
	return r
}

func TestPotassiumShimIsWrittenOnceAndPrependedToPythonPath(t *testing.T) {
	b := testBackend(t)
	spec := shSpec("r1", "")
	spec.Model.Env = map[string]string{"PYTHONPATH": "/opt/lib"}
	for range 2 {
		got, err := b.preparePotassium(spec)
		if err != nil {
			t.Fatal(err)
		}
		shimDir := filepath.Join(b.cfg.LogDir, "team", "proj-r1", ".potassium-shim")
		if want := shimDir + ":/opt/lib"; got["PYTHONPATH"] != want {
			t.Errorf("PYTHONPATH = %q, want %q", got["PYTHONPATH"], want)
		}
		b, err := os.ReadFile(filepath.Join(shimDir, "sitecustomize.py"))
		if err != nil || string(b) != string(potassiumShim) {
			t.Errorf("shim file: %v", err)
		}
		if files, _ := os.ReadDir(shimDir); len(files) != 1 {
			t.Errorf("shim dir holds %d files, want 1", len(files))
		}
	}
	if spec.Model.Env["PYTHONPATH"] != "/opt/lib" {
		t.Error("preparePotassium changed the caller's Env map")
	}
}

// TestPotassiumReplicasRunSideBySide runs two replicas of one unmodified Potassium
// app (both ask for port 8000) and checks the protocol end to end.
func TestPotassiumReplicasRunSideBySide(t *testing.T) {
	be := testBackend(t)
	a := startModel(t, be, potassiumSpec(t, "pot-a"))
	b := startModel(t, be, potassiumSpec(t, "pot-b"))
	waitReady(t, a)
	waitReady(t, b)
	if a.port == b.port || a.port == 8000 || b.port == 8000 {
		t.Fatalf("ports %d and %d", a.port, b.port)
	}

	t.Run("overlapping calls are served by different replicas", func(t *testing.T) {
		var wg sync.WaitGroup
		replies := make([]potassiumReply, 2)
		start := time.Now()
		for i, p := range []*Process{a, b} {
			wg.Go(func() { replies[i] = potassiumInfer(t, p, `{"sleep": 1, "n": `+strconv.Itoa(i)+`}`) })
		}
		wg.Wait()
		if took := time.Since(start); took > 1900*time.Millisecond {
			t.Errorf("two 1 s calls took %v: they did not overlap", took)
		}
		for i, p := range []*Process{a, b} {
			r := replies[i]
			if r.Pid != p.pid || r.Replica != p.spec.ReplicaID || r.Echo["n"] != float64(i) {
				t.Errorf("reply %d = %+v; want pid %d, replica %s", i, r, p.pid, p.spec.ReplicaID)
			}
			if len(r.RequestID) != 36 {
				t.Errorf("request id %q is not a uuid", r.RequestID)
			}
		}
		if replies[0].Pid == replies[1].Pid {
			t.Errorf("both calls served by pid %d", replies[0].Pid)
		}
	})

	t.Run("exception", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		_, err := a.Infer(ctx, json.RawMessage(`{"raise": true}`))
		var exc *backend.ExceptionError
		if !errors.As(err, &exc) || exc.LastLine != "ValueError: bad prompt" {
			t.Fatalf("Infer = %v (%T); want *ExceptionError with ValueError: bad prompt", err, err)
		}
		// The full traceback is in the replica log, printed by the app.
		waitFor(t, "traceback in the log", func() bool {
			b, _ := os.ReadFile(be.logPath(a.spec))
			return strings.Contains(string(b), "Traceback (most recent call last)") &&
				strings.Contains(string(b), `raise ValueError("bad prompt")`)
		})
		// The replica still serves.
		if r := potassiumInfer(t, a, `{"after": 1}`); r.Echo["after"] != float64(1) {
			t.Errorf("after the exception: %+v", r)
		}
	})

	base := func(p *Process) string { return "http://127.0.0.1:" + strconv.Itoa(p.port) }
	post := func(t *testing.T, url, body string) (int, string) {
		t.Helper()
		resp, err := http.Post(url, "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, string(b)
	}

	t.Run("status", func(t *testing.T) {
		for _, path := range []string{"/__status__", "/_k/status"} {
			resp, err := http.Get(base(b) + path)
			if err != nil {
				t.Fatal(err)
			}
			var st map[string]any
			err = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if err != nil || resp.StatusCode != 200 {
				t.Fatalf("GET %s: %d, %v", path, resp.StatusCode, err)
			}
			for _, k := range []string{"gpu_available", "sequence_number", "idle_time", "inference_time"} {
				if _, ok := st[k]; !ok {
					t.Errorf("GET %s = %v: no %s", path, st, k)
				}
			}
			if st["gpu_available"] != true || st["sequence_number"].(float64) < 1 {
				t.Errorf("GET %s = %v", path, st)
			}
		}
	})

	t.Run("bad JSON is 400 with an empty body", func(t *testing.T) {
		if status, body := post(t, base(a)+"/", "not json"); status != 400 || body != "" {
			t.Errorf("POST not json = %d %q", status, body)
		}
	})

	t.Run("warmup", func(t *testing.T) {
		status, body := post(t, base(b)+"/_k/warmup", "")
		var got map[string]any
		if status != 200 || json.Unmarshal([]byte(body), &got) != nil || got["warm"] != true {
			t.Errorf("POST /_k/warmup = %d %q", status, body)
		}
	})

	t.Run("background route answers at once", func(t *testing.T) {
		start := time.Now()
		status, body := post(t, base(b)+"/background", `{"sleep": 2}`)
		if status != 200 || strings.TrimSpace(body) != `{"started": true}` || time.Since(start) > time.Second {
			t.Errorf("POST /background = %d %q after %v", status, body, time.Since(start))
		}
	})
}
