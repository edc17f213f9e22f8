package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"inferd/internal/testenv"
	"inferd/scheduler/backend/local"
	"inferd/store"
)

// TestLocalBackendRunsEchoModel runs real examples/echo processes through the
// scheduler on the local-process backend (with the in-memory store): success,
// model errors, a crash, an inference timeout and a model that never boots
// each end as designed.
func TestLocalBackendRunsEchoModel(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real model processes")
	}
	if _, err := exec.LookPath("python3"); err != nil {
		testenv.Missing(t, "python3 on PATH: examples/echo cannot run")
	}
	echo, err := filepath.Abs("../examples/echo")
	if err != nil {
		t.Fatal(err)
	}
	p := testProject("echo", minMax(1, 2), func(p *store.Project) {
		p.InferenceTimeout = 1
		p.Model.Command = []string{"python3", "server.py"}
		p.Model.Dir = echo
		p.Model.BootTimeout = 30
	})
	broken := testProject("broken", func(p *store.Project) {
		p.Model.Command = []string{"python3", "server.py"}
		p.Model.Dir = echo
		p.Model.Env = map[string]string{"BOOT_FAIL": "1"}
	})
	st := newTestStore(t, p, broken)
	defer st.close()
	dir := t.TempDir()
	b, err := local.New(local.Config{LogDir: filepath.Join(dir, "logs"), RunDir: filepath.Join(dir, "run"), StopGrace: time.Second, User: "root"}, zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(b.Close)
	s := New(Config{RestartBackoff: 50 * time.Millisecond}, st, b, RealClock(), zerolog.Nop())
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- s.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-ran; err != nil {
			t.Errorf("Run: %v", err)
		}
	}()

	run := func(p store.Project, inputs string) store.Call {
		t.Helper()
		c, err := s.Submit(context.Background(), p, json.RawMessage(inputs))
		if err != nil {
			t.Fatalf("Submit: %v", err)
		}
		_, done, err := s.Lookup(c.ID)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		select {
		case <-done:
		case <-time.After(60 * time.Second):
			t.Fatalf("call %s did not finish", inputs)
		}
		got, _, err := s.Lookup(c.ID)
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		return got
	}
	for _, tc := range []struct {
		p      store.Project
		inputs string
		want   string // message, or the echoed inputs for "success"
	}{
		{p, `{"a":1}`, `{"a":1}`},
		{p, `{"fail":"nope"}`, `error: model returned HTTP 500: {"error": "nope"}`},
		{p, `{"raw":"nope"}`, `error: model returned an invalid reply: reply is not JSON: "nope"`},
		{p, `{"crash":true}`, "error: model process exited (exit status 3) during inference"},
		{p, `{"hang":true}`, "error: inference timed out after 1s"},
		{p, `{"a":2}`, `{"a":2}`},
		{broken, `{}`, "error: model failed to start: process exited with status 1: boot failed: BOOT_FAIL is set"},
	} {
		got := run(tc.p, tc.inputs)
		if got.Message == "success" {
			var out struct{ Echo json.RawMessage }
			if err := json.Unmarshal(got.Outputs, &out); err != nil || compact(out.Echo) != tc.want {
				t.Errorf("%s: outputs %s, want the inputs echoed", tc.inputs, got.Outputs)
			}
			continue
		}
		if got.Message != tc.want {
			t.Errorf("%s: message %q, want %q", tc.inputs, got.Message, tc.want)
		}
	}
}

func compact(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(b)
	}
	return buf.String()
}
