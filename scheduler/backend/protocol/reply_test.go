package protocol

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"testing"

	"inferd/scheduler/backend"
)

// largeReplyServer answers every POST with reply, announcing its length
// unless chunked.
func largeReplyServer(t *testing.T, reply []byte, chunked bool, extra int) *Client {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !chunked {
			w.Header().Set("Content-Length", strconv.Itoa(len(reply)-extra))
		}
		_, _ = w.Write(reply)
	}))
	t.Cleanup(srv.Close)
	c, err := New(Config{Addr: srv.Listener.Addr().String(), Dial: (&net.Dialer{}).DialContext})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// A model's reply of megabytes is read once into a buffer of its size: the
// daemon holds one copy of it, not the copies and the doubled buffer of
// reading it by growing.
func TestLargeReplyIsReadOnceIntoItsFinalBuffer(t *testing.T) {
	reply := []byte(`{"image":"` + string(bytes.Repeat([]byte("A"), 8<<20)) + `"}`)
	c := largeReplyServer(t, reply, false, 0)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	out, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)})
	runtime.ReadMemStats(&after)
	if err != nil || !bytes.Equal(out, reply) {
		t.Fatalf("Infer = %d bytes, %v; want the %d sent", len(out), err, len(reply))
	}
	if cap(out) != len(reply) {
		t.Errorf("the reply is held in a buffer of %d bytes for %d", cap(out), len(reply))
	}
	// The test server's side of the exchange allocates in this process too,
	// a little; growing the buffer by doubling costs about 2x.
	if got := after.TotalAlloc - before.TotalAlloc; got > uint64(len(reply))*5/4 {
		t.Errorf("reading a %d-byte reply allocated %d bytes", len(reply), got)
	}
}

// A chunked reply (no length) is read whole, and one that ends before its
// Content-Length is a broken exchange.
func TestReplyLengthMustMatchItsContentLength(t *testing.T) {
	reply := []byte(`{"a":"` + string(bytes.Repeat([]byte("b"), 100<<10)) + `"}`)
	c := largeReplyServer(t, reply, true, 0)
	if out, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)}); err != nil || !bytes.Equal(out, reply) {
		t.Errorf("chunked reply: %d bytes, %v", len(out), err)
	}
	// The server announces less than it then writes: net/http refuses the
	// write, and the reply ends before the length it announced.
	c = largeReplyServer(t, reply, false, 10)
	var te *TransportError
	if _, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)}); !errors.As(err, &te) {
		t.Errorf("reply cut short: %v, want a *TransportError", err)
	}
}

// A non-2xx reply's Retry-After reaches the caller as the model sent it,
// delay-seconds or an HTTP date, so that a door passes it on unchanged; one
// no client could read is dropped.
func TestErrorReplyKeepsItsRetryAfter(t *testing.T) {
	for _, tc := range []struct{ sent, want string }{
		{"7", "7"},
		{"Wed, 21 Oct 2026 07:28:00 GMT", "Wed, 21 Oct 2026 07:28:00 GMT"},
		{"", ""},
		{"soon", ""},
		{"-1", ""},
	} {
		c, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
			if tc.sent != "" {
				w.Header().Set("Retry-After", tc.sent)
			}
			http.Error(w, "busy", http.StatusTooManyRequests)
		})
		var he *backend.HTTPError
		_, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)})
		if !errors.As(err, &he) {
			t.Fatalf("Retry-After %q: Infer = %v, want an HTTPError", tc.sent, err)
		}
		if he.RetryAfter != tc.want {
			t.Errorf("Retry-After %q: RetryAfter %q, want %q", tc.sent, he.RetryAfter, tc.want)
		}
	}
}
