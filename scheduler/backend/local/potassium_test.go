package local

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"inferd/internal/testenv"
	"inferd/scheduler/backend"
	"inferd/store"
)

// potassiumReply is what examples/potassium/app.py answers.
type potassiumReply struct {
	Echo      map[string]any `json:"echo"`
	Pid       int            `json:"pid"`
	Replica   string         `json:"replica"`
	RequestID string         `json:"request_id"`
	// RequestIDHeader is request.headers.get("x-banana-request-id"): headers
	// are looked up case-insensitively.
	RequestIDHeader string `json:"request_id_header"`
	OthersRunning   int    `json:"others_running"` // calls running when it started
}

// potassiumPython is the interpreter the Potassium tests run: Debian's, which
// scripts/test-deps.sh gives Flask (python3-flask), whatever python3 is on PATH.
const potassiumPython = "/usr/bin/python3"

// potassiumSpec returns a Spec running examples/potassium/app.py (an unmodified
// Potassium app on the framework's test double); without Flask the test skips,
// or fails under make test (testenv.Missing).
func potassiumSpec(t *testing.T, id string) backend.Spec {
	t.Helper()
	if out, err := exec.Command(potassiumPython, "-c", "import flask, werkzeug").CombinedOutput(); err != nil {
		testenv.Missing(t, "%s cannot import flask and werkzeug (%v: %s); install python3-flask (scripts/test-deps.sh does)", potassiumPython, err, bytes.TrimSpace(out))
	}
	app, err := filepath.Abs("../../../examples/potassium")
	if err != nil {
		t.Fatal(err)
	}
	return backend.Spec{
		ReplicaID: id,
		ProjectID: "proj-potassium",
		TeamID:    "team",
		Model:     store.ModelSpec{Command: []string{potassiumPython, "app.py"}, Dir: app, Protocol: store.ProtocolPotassium},
	}
}

// potassiumCall is one Infer on a potassium replica, run on its own goroutine
// (which must not end the test) and decoded on the test's.
type potassiumCall struct {
	inputs string
	done   chan struct{}
	out    json.RawMessage
	err    error
}

// startPotassiumCall starts Infer(inputs) on p without waiting for it.
func startPotassiumCall(p *Process, inputs string) *potassiumCall {
	c := &potassiumCall{inputs: inputs, done: make(chan struct{})}
	go func() {
		defer close(c.done)
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		c.out, c.err = p.Infer(ctx, backend.Request{Inputs: json.RawMessage(inputs)})
	}()
	return c
}

// reply waits for the call and decodes its reply; it fails the test on an error.
func (c *potassiumCall) reply(t *testing.T, p *Process) potassiumReply {
	t.Helper()
	<-c.done // Infer gives up by itself after testDeadline
	if c.err != nil {
		t.Fatalf("Infer(%s): %v; last line %q", c.inputs, c.err, p.LastLogLine())
	}
	var r potassiumReply
	if err := json.Unmarshal(c.out, &r); err != nil {
		t.Fatalf("reply %s: %v", c.out, err)
	}
	return r
}

func potassiumInfer(t *testing.T, p *Process, inputs string) potassiumReply {
	t.Helper()
	return startPotassiumCall(p, inputs).reply(t, p)
}

// holdInputs returns inputs (fields plus "hold") that make app.py create started
// and then wait until release exists.
func holdInputs(fields map[string]any, started, release string) string {
	in := map[string]any{"hold": map[string]string{"started": started, "release": release}}
	for k, v := range fields {
		in[k] = v
	}
	b, _ := json.Marshal(in)
	return string(b)
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func touch(t *testing.T, path string) {
	t.Helper()
	if err := os.WriteFile(path, nil, 0o644); err != nil {
		t.Fatal(err)
	}
}

// potassiumStatus is GET /__status__ of a replica.
type potassiumStatus struct {
	GPUAvailable   bool `json:"gpu_available"`
	SequenceNumber int  `json:"sequence_number"`
	IdleTime       int  `json:"idle_time"`
	InferenceTime  int  `json:"inference_time"`
}

func statusOf(t *testing.T, p *Process) potassiumStatus {
	t.Helper()
	resp, err := modelClient(p).Get(modelURL(p, "/__status__"))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var st potassiumStatus
	if err := json.NewDecoder(resp.Body).Decode(&st); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET /__status__: %d, %v", resp.StatusCode, err)
	}
	return st
}

// waitsForTheWorker checks that a call sent to p while its worker is held (by a
// call waiting for release) runs only once release exists: Potassium serves one
// call at a time. The call is known to have arrived when the status's sequence
// number counts it, so the check does not depend on timing.
func waitsForTheWorker(t *testing.T, p *Process, release string) {
	t.Helper()
	before := statusOf(t, p).SequenceNumber
	queued := startPotassiumCall(p, `{"queued": true}`)
	waitFor(t, "the queued call to arrive", func() bool { return statusOf(t, p).SequenceNumber > before })
	if st := statusOf(t, p); st.GPUAvailable {
		t.Errorf("status while the worker is held = %+v; want gpu_available false", st)
	}
	select {
	case <-queued.done:
		t.Errorf("a call finished while the worker was held (err %v): calls to one app must run one at a time", queued.err)
	default:
	}
	touch(t, release)
	if r := queued.reply(t, p); r.OthersRunning != 0 {
		t.Errorf("the queued call started while %d other calls ran", r.OthersRunning)
	}
}

// TestPotassiumShimIsTheReplicasOwn: the shim goes into a folder of the
// replica's own, in its private directory (which inferd makes afresh in a
// directory only it writes to), owned by the model's user, first on the
// model's PYTHONPATH; it goes with the replica.
func TestPotassiumShimIsTheReplicasOwn(t *testing.T) {
	needRoot(t)
	b := testBackendWith(t, perProject)
	spec := shSpec("r1", "")
	spec.Model.Env = map[string]string{"PYTHONPATH": "/opt/lib"}
	x, err := b.sb.newBox(spec)
	if err != nil {
		t.Fatal(err)
	}
	got, err := preparePotassium(spec, x)
	if err != nil {
		t.Fatal(err)
	}
	shimDir := filepath.Join(x.dir, ".inferd-potassium")
	if want := shimDir + ":/opt/lib"; got["PYTHONPATH"] != want {
		t.Errorf("PYTHONPATH = %q, want %q", got["PYTHONPATH"], want)
	}
	shim := filepath.Join(shimDir, "sitecustomize.py")
	data, err := os.ReadFile(shim)
	if err != nil || string(data) != string(potassiumShim) {
		t.Errorf("shim file: %v", err)
	}
	for _, path := range []string{x.dir, shimDir, shim} {
		fi, err := os.Stat(path)
		if err != nil || fi.Sys().(*syscall.Stat_t).Uid != x.runAs.UID {
			t.Errorf("%s: %v; want it owned by the model's uid %d", path, err, x.runAs.UID)
		}
	}
	if spec.Model.Env["PYTHONPATH"] != "/opt/lib" {
		t.Error("preparePotassium changed the caller's Env map")
	}
	if err := x.undo(); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(shimDir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the shim outlived its replica: %v", err)
	}
}

// TestPotassiumReplicasRunSideBySide runs two replicas of one unmodified Potassium
// app (both ask for port 8000) and checks the protocol end to end, as Potassium
// 0.5.0 speaks it (each app serves one call at a time): each in a network namespace
// of its own, where each has its own port 8000, and on the host's network, where the
// shim moves each to a port of its own.
func TestPotassiumReplicasRunSideBySide(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  func(*Config)
	}{
		{"private network", func(*Config) {}},
		{"host network", hostNetwork},
	} {
		t.Run(tc.name, func(t *testing.T) { testPotassiumSideBySide(t, testBackendWith(t, tc.set)) })
	}
}

func testPotassiumSideBySide(t *testing.T, be *Backend) {
	a := startModel(t, be, potassiumSpec(t, "pot-a"))
	b := startModel(t, be, potassiumSpec(t, "pot-b"))
	waitReady(t, a)
	waitReady(t, b)
	switch private := a.box.private; {
	case private && (a.port != 8000 || b.port != 8000):
		t.Fatalf("in namespaces of their own the apps listen on 8000, not %d and %d", a.port, b.port)
	case !private && (a.port == b.port || a.port == 8000 || b.port == 8000):
		t.Fatalf("on the host's network the shim gives each app its own port, not %d and %d", a.port, b.port)
	}
	dir := t.TempDir() // the files calls hold on

	t.Run("overlapping calls are served by different replicas", func(t *testing.T) {
		// Each call holds its replica until both have started: they overlap.
		release := filepath.Join(dir, "overlap-release")
		var calls []*potassiumCall
		for i, p := range []*Process{a, b} {
			started := filepath.Join(dir, "overlap-started-"+strconv.Itoa(i))
			calls = append(calls, startPotassiumCall(p, holdInputs(map[string]any{"n": i}, started, release)))
		}
		waitFor(t, "both calls running at once", func() bool {
			return fileExists(filepath.Join(dir, "overlap-started-0")) && fileExists(filepath.Join(dir, "overlap-started-1"))
		})
		touch(t, release)
		for i, p := range []*Process{a, b} {
			r := calls[i].reply(t, p)
			if r.Pid != seenPid(t, p) || r.Replica != p.spec.ReplicaID || r.Echo["n"] != float64(i) {
				t.Errorf("reply %d = %+v; want pid %d, replica %s", i, r, seenPid(t, p), p.spec.ReplicaID)
			}
			if len(r.RequestID) != 36 || r.RequestIDHeader != r.RequestID {
				t.Errorf("request id %q, header x-banana-request-id %q: want the same uuid", r.RequestID, r.RequestIDHeader)
			}
		}
	})

	t.Run("calls to one replica run one at a time", func(t *testing.T) {
		release := filepath.Join(dir, "serial-release")
		started := filepath.Join(dir, "serial-started")
		first := startPotassiumCall(a, holdInputs(nil, started, release))
		waitFor(t, "the first call running", func() bool { return fileExists(started) })
		waitsForTheWorker(t, a, release)
		first.reply(t, a)
	})

	t.Run("exception", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		_, err := a.Infer(ctx, backend.Request{Inputs: json.RawMessage(`{"raise": true}`)})
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

	t.Run("a handler that returns no Response raises", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		_, err := a.Infer(ctx, backend.Request{Inputs: json.RawMessage(`{"return_dict": true}`)})
		var exc *backend.ExceptionError
		if !errors.As(err, &exc) || exc.LastLine != "Exception: Potassium Response object not returned" {
			t.Fatalf("Infer = %v (%T); want *ExceptionError: Potassium Response object not returned", err, err)
		}
	})

	post := func(t *testing.T, p *Process, path, body string) (int, string) {
		t.Helper()
		resp, err := modelClient(p).Post(modelURL(p, path), "application/json", strings.NewReader(body))
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
			resp, err := modelClient(b).Get(modelURL(b, path))
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
		if status, body := post(t, a, "/", "not json"); status != 400 || body != "" {
			t.Errorf("POST not json = %d %q", status, body)
		}
	})

	t.Run("warmup", func(t *testing.T) {
		status, body := post(t, b, "/_k/warmup", "")
		var got map[string]any
		if status != 200 || json.Unmarshal([]byte(body), &got) != nil || got["warm"] != true {
			t.Errorf("POST /_k/warmup = %d %q", status, body)
		}
	})

	t.Run("a background call answers at once and holds the worker", func(t *testing.T) {
		// The handler waits for release, which exists only after the answer
		// came: it answered before its handler finished.
		release := filepath.Join(dir, "background-release")
		started := filepath.Join(dir, "background-started")
		status, body := post(t, b, "/background", holdInputs(nil, started, release))
		var got map[string]any
		if status != 200 || json.Unmarshal([]byte(body), &got) != nil || got["started"] != true {
			t.Fatalf("POST /background = %d %q", status, body)
		}
		waitFor(t, "the background handler running", func() bool { return fileExists(started) })
		waitsForTheWorker(t, b, release)
	})
}
