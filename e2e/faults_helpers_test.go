package e2e

// Helpers for the fault tests (e2e/faults_test.go): an HTTP client that
// reports errors instead of failing the test, so load goroutines can see the
// daemon die; a reader of the data file that checks its integrity; and the
// inferd binary built with failpoints.

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
	"inferd/store"
	"inferd/store/bolt"
)

// faultClient talks to the inference API and returns transport errors, which
// a test expects while it kills the daemon.
// noLimits turns the per-key request and wait limits off (config.example.yaml,
// limits). A fault test's load must fail only through the fault it injects:
// under the default limits a daemon that stalls shows up as "rate limit
// exceeded" from the load generator instead of as what went wrong.
const noLimits = "limits:\n  requestsPerSecond: 0\n  maxWaitsPerKey: 0\n  maxWaits: 0\n"

type faultClient struct {
	base string
	key  string
}

var faultHTTP = &http.Client{Timeout: 2 * time.Minute}

func (c faultClient) post(path, body string) (map[string]any, error) {
	req, err := http.NewRequestWithContext(context.Background(), "POST", c.base+path, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := faultHTTP.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	var obj map[string]any
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("%s answered HTTP %d with non-JSON %q", path, resp.StatusCode, raw)
	}
	if resp.StatusCode != 200 {
		return obj, fmt.Errorf("%s answered HTTP %d: %v", path, resp.StatusCode, obj)
	}
	return obj, nil
}

func (c faultClient) start(modelKey, inputs string, startOnly bool) (map[string]any, error) {
	return c.post("/start/v4", fmt.Sprintf(`{"apiKey":%q,"modelKey":%q,"startOnly":%t,"modelInputs":%s}`,
		c.key, modelKey, startOnly, inputs))
}

func (c faultClient) check(callID string, longPoll bool) (map[string]any, error) {
	return c.post("/check/v4/", fmt.Sprintf(`{"apiKey":%q,"callID":%q,"longPoll":%t}`, c.key, callID, longPoll))
}

// final long-polls a call until it has ended and returns its answer.
func (c faultClient) final(callID string) (map[string]any, error) {
	for i := 0; i < 60; i++ {
		r, err := c.check(callID, true)
		if err != nil {
			return nil, err
		}
		if isFinal(r) {
			return r, nil
		}
	}
	return nil, fmt.Errorf("call %s did not end within 60 long polls [%s]", callID, testenv.Load())
}

func message(r map[string]any) string { m, _ := r["message"].(string); return m }

func isFinal(r map[string]any) bool {
	m := message(r)
	return m == "success" || strings.HasPrefix(m, "error:")
}

// echoedIndex returns the "i" input the echo model echoed back in a success.
func echoedIndex(r map[string]any) (int, bool) {
	outs, ok := r["modelOutputs"].([]any)
	if !ok || len(outs) != 1 {
		return 0, false
	}
	out, _ := outs[0].(map[string]any)
	echo, _ := out["echo"].(map[string]any)
	i, ok := echo["i"].(float64)
	return int(i), ok
}

// inputIndex returns the "i" of a stored call's inputs, or -1.
func inputIndex(c store.Call) int {
	var in struct{ I *int }
	if json.Unmarshal(c.Inputs, &in) != nil || in.I == nil {
		return -1
	}
	return *in.I
}

// readDataFile opens a stopped (or killed) daemon's data file the way the
// daemon does, then checks bbolt's page structure and the call indexes the
// store keeps (store/bolt/schema.go), and returns every stored call.
func readDataFile(t *testing.T, path string) map[string]store.Call {
	t.Helper()
	st, err := bolt.Open(path, bolt.Options{Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("the data file does not open cleanly: %v", err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	calls, problems, err := bolt.Check(path, 10*time.Second)
	if err != nil {
		t.Fatalf("reading the data file: %v", err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	return calls
}

// failpointBinary is inferd with store/bolt/failpoint.go's crash points:
// the harness's one binary, built with -tags failpoints (see TestMain).
func failpointBinary(t *testing.T) string {
	t.Helper()
	return inferdBin
}

// envInt reads a positive integer setting of the fault tests.
func envInt(t *testing.T, name string, def int) int {
	t.Helper()
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

// report appends a line of figures to $INFERD_FAULTS_REPORT when it is set
// (make faults sets it), and logs it either way.
func report(t *testing.T, format string, args ...any) {
	t.Helper()
	line := fmt.Sprintf(format, args...)
	t.Log(line)
	path := os.Getenv("INFERD_FAULTS_REPORT")
	if path == "" {
		return
	}
	f, err := os.OpenFile(path, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
	if err != nil {
		t.Errorf("report: %v", err)
		return
	}
	defer f.Close()
	fmt.Fprintf(f, "%s: %s\n", t.Name(), line)
}
