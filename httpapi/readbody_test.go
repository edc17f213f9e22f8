package httpapi

import (
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"

	"inferd/pipeline"
)

// TestAnnouncedBodySizeCostsNoMemoryUpFront: a client that announces a body
// as large as the cap and then sends nothing must not make the server set
// that much memory aside, or a few hundred such connections (each held open
// for the read timeout) would exhaust the machine without sending a byte.
func TestAnnouncedBodySizeCostsNoMemoryUpFront(t *testing.T) {
	env := newEnv(t, Options{}) // the default cap, 10 MiB
	const requests = 10
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	for range requests {
		req := httptest.NewRequest(http.MethodPost, "/check/v4", nil)
		req.ContentLength = pipeline.DefaultMaxBodyBytes
		req.Body = io.NopCloser(iotest.ErrReader(io.ErrUnexpectedEOF)) // the client went away
		rec := httptest.NewRecorder()
		env.h.ServeHTTP(rec, req)
		m := inferenceReply(t, rec)
		if msg := m["message"].(string); !strings.HasPrefix(msg, "error: could not read the request body") {
			t.Fatalf("message %q", msg)
		}
	}
	runtime.ReadMemStats(&after)
	if got := after.TotalAlloc - before.TotalAlloc; got > pipeline.DefaultMaxBodyBytes {
		t.Errorf("%d requests that sent no body allocated %d bytes; each reserved its announced size", requests, got)
	}
}

// TestBodyLargerThanThePresizeArrivesWhole: a body past what readBody sets
// aside up front still reaches the model unchanged.
func TestBodyLargerThanThePresizeArrivesWhole(t *testing.T) {
	env := newEnv(t, Options{})
	inputs := `{"pad": "` + strings.Repeat("x", 4*maxPresize) + `"}`
	m := inferenceReply(t, serve(env.h, http.MethodPost, "/start/v4",
		`{"apiKey": "`+keyAcme+`", "modelKey": "mk-echo", "startOnly": true, "modelInputs": `+inputs+`}`))
	id, _ := m["callID"].(string)
	c, _, err := env.sched.Lookup(id)
	if err != nil {
		t.Fatalf("message %q: %v", m["message"], err)
	}
	if string(c.Inputs) != inputs {
		t.Errorf("inputs arrived as %d bytes, want %d", len(c.Inputs), len(inputs))
	}
}

// TestLargeBodyCostsAboutOneCopy: a start with megabytes of inputs allocates
// about the body once while it is read and decoded (1.3 copies: the small
// buffers it grew through), not the three or four copies that growing by
// doubling and copying the inputs out of the body cost.
func TestLargeBodyCostsAboutOneCopy(t *testing.T) {
	env := newEnv(t, Options{})
	inputs := `{"image": "` + strings.Repeat("A", 4<<20) + `"}`
	body := `{"apiKey": "` + keyAcme + `", "modelKey": "mk-echo", "startOnly": true, "modelInputs": ` + inputs + `}`
	// TotalAlloc counts the whole process: tests running in parallel only
	// add to it, so the least of a few tries is this request's own.
	got := uint64(math.MaxUint64)
	for range 5 {
		var before, after runtime.MemStats
		runtime.ReadMemStats(&before)
		rec := serve(env.h, http.MethodPost, "/start/v4", body)
		runtime.ReadMemStats(&after)
		if m := inferenceReply(t, rec); m["message"] != "queued" {
			t.Fatalf("message %q", m["message"])
		}
		got = min(got, after.TotalAlloc-before.TotalAlloc)
	}
	t.Logf("a start of %d bytes allocated %d bytes", len(body), got)
	if limit := uint64(len(body)) * 3 / 2; got > limit {
		t.Errorf("a start of %d bytes allocated %d bytes, more than %d (1.5 copies)", len(body), got, limit)
	}
}
