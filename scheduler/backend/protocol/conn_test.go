package protocol

import (
	"bufio"
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os/exec"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	"github.com/rs/zerolog"

	"inferd/internal/testenv"
	"inferd/scheduler/backend"
)

// countingListener is the model's listener, with a count of the connections the
// pool dialled to it. The pool's dialer counts them, not Accept: a listener on
// 127.0.0.1:0 can get a port that something else on the box (another test's
// daemon, probing a replica port it just gave up) still connects to, and such a
// stray connection is no dial of the pool's.
type countingListener struct {
	net.Listener
	dialled atomic.Int64
}

func listen(t testing.TB) *countingListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return &countingListener{Listener: ln}
}

// poolClient returns a Client whose calls go to ln: these tests are about the
// connections, the model is a Go server. Every connection it dials, through its
// pool or through net/http for large requests, is counted in ln.dialled.
func poolClient(t testing.TB, ln *countingListener) *Client {
	count := func(string, string, syscall.RawConn) error {
		ln.dialled.Add(1)
		return nil
	}
	c, err := New(Config{
		Addr: ln.Addr().String(),
		Dial: (&net.Dialer{Timeout: ConnectTimeout, Control: count}).DialContext,
		Log:  zerolog.New(zerolog.NewTestWriter(t)),
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// serve runs h on a counting listener and returns a Client calling it.
func serve(t testing.TB, h http.HandlerFunc) (*Client, *countingListener) {
	t.Helper()
	ln := listen(t)
	srv := httptest.NewUnstartedServer(h)
	srv.Listener = ln
	srv.Start()
	t.Cleanup(srv.Close)
	return poolClient(t, ln), ln
}

// idleConns is how many connections the pool keeps for reuse.
func idleConns(p *Client) int {
	p.conns.mu.Lock()
	defer p.conns.mu.Unlock()
	return len(p.conns.idle)
}

func mustInfer(t *testing.T, p *Client, inputs string) string {
	t.Helper()
	out, err := p.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(inputs)})
	if err != nil {
		t.Fatalf("Infer(%s): %v", inputs, err)
	}
	return string(out)
}

func echoHandler(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

func TestPoolReusesOneConnectionForSequentialCalls(t *testing.T) {
	p, ln := serve(t, echoHandler)
	for i := range 20 {
		in := `{"n":` + string(rune('0'+i%10)) + `}`
		if got := mustInfer(t, p, in); got != in {
			t.Fatalf("call %d: got %s, want %s", i, got, in)
		}
	}
	if n := ln.dialled.Load(); n != 1 {
		t.Fatalf("dialled %d connections for 20 sequential calls, want 1", n)
	}
}

func TestPoolReadsChunkedReplyAndReusesConnection(t *testing.T) {
	p, ln := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"parts":[1,`))
		w.(http.Flusher).Flush() // no Content-Length: the reply is chunked
		w.Write([]byte(`2]}`))
	})
	for range 3 {
		if got := mustInfer(t, p, `{}`); got != `{"parts":[1,2]}` {
			t.Fatalf("got %s", got)
		}
	}
	if n := ln.dialled.Load(); n != 1 {
		t.Fatalf("dialled %d connections, want 1", n)
	}
}

func TestPoolHonoursConnectionClose(t *testing.T) {
	p, ln := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Connection", "close")
		echoHandler(w, r)
	})
	for range 3 {
		mustInfer(t, p, `[1]`)
	}
	if n := ln.dialled.Load(); n != 3 {
		t.Fatalf("dialled %d connections, want one per call (3)", n)
	}
	if n := idleConns(p); n != 0 {
		t.Fatalf("%d connections pooled after Connection: close", n)
	}
}

func TestPoolSkipsConnectionsTheModelClosedWhileIdle(t *testing.T) {
	// A raw HTTP/1.1 server that answers one request per connection with a
	// Content-Length and no "Connection: close", then closes: to the client the
	// connection looks reusable until it finds it closed.
	ln := listen(t)
	closedConn := make(chan struct{})
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// One goroutine per connection, and a signal only for Infer's POST:
			// a stray connection from elsewhere on the box (see
			// countingListener) must neither hold up nor stand in for the pool's.
			go func() {
				defer c.Close()
				req, err := http.ReadRequest(bufio.NewReader(c))
				if err != nil || req.Method != http.MethodPost {
					return
				}
				io.Copy(io.Discard, req.Body)
				io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4\r\n\r\ntrue")
				c.Close()
				closedConn <- struct{}{}
			}()
		}
	}()
	p := poolClient(t, ln)
	for i := range 5 {
		if got := mustInfer(t, p, `{}`); got != "true" {
			t.Fatalf("call %d: got %s", i, got)
		}
		<-closedConn
		// The model's close reaches our end of the loopback connection almost at
		// once; wait for it so the next call meets a closed idle connection rather
		// than racing the close (a race net/http has too).
		waitFor(t, "the model's close to arrive", func() bool {
			p.conns.mu.Lock()
			defer p.conns.mu.Unlock()
			return len(p.conns.idle) == 1 && !p.conns.idle[0].alive()
		})
	}
	if n := ln.dialled.Load(); n != 5 {
		t.Fatalf("dialled %d connections, want 5", n)
	}
}

func TestPoolDoesNotReuseAConnectionAfterCancel(t *testing.T) {
	sent := make(chan struct{})
	release := make(chan struct{})
	var calls atomic.Int64
	p, ln := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte(`{"partial":`))
		if calls.Add(1) == 1 {
			w.(http.Flusher).Flush()
			close(sent)
			<-release
			return
		}
		w.Write([]byte(`1}`))
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, err := p.Infer(ctx, backend.Request{Inputs: json.RawMessage(`{}`)})
		done <- err
	}()
	<-sent // headers and part of the body are out: Infer waits for the rest
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("Infer after cancel: %v, want context.Canceled", err)
	}
	if n := idleConns(p); n != 0 {
		t.Fatalf("%d connections pooled after a cancelled call", n)
	}
	close(release)
	if got := mustInfer(t, p, `{}`); got != `{"partial":1}` {
		t.Fatalf("got %s", got)
	}
	if n := ln.dialled.Load(); n != 2 {
		t.Fatalf("dialled %d connections, want 2 (the cancelled one is not reused)", n)
	}
}

func TestPoolDoesNotReuseAConnectionWithAnUnreadBody(t *testing.T) {
	big := `"` + strings.Repeat("x", 4<<10) + `"`
	tests := []struct {
		name    string
		status  int
		body    string
		wantErr func(error) bool
	}{
		{"oversize reply", 200, big, func(err error) bool { return errors.Is(err, backend.ErrInvalidReply) }},
		{"error body over a KiB", 500, big, func(err error) bool {
			var he *backend.HTTPError
			return errors.As(err, &he) && he.Status == 500 && len(he.Body) == errorBodyBytes
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, ln := serve(t, func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				w.WriteHeader(tt.status)
				w.Write([]byte(tt.body))
			})
			p.cfg.MaxReplyBytes = 1 << 10
			if _, err := p.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)}); !tt.wantErr(err) {
				t.Fatalf("Infer: %v", err)
			}
			if n := idleConns(p); n != 0 {
				t.Fatalf("%d connections pooled with the rest of a body unread", n)
			}
			if _, err := p.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)}); !tt.wantErr(err) {
				t.Fatalf("second Infer: %v", err)
			}
			if n := ln.dialled.Load(); n != 2 {
				t.Fatalf("dialled %d connections, want 2 (none reused)", n)
			}
		})
	}
}

func TestPoolReusesAConnectionAfterACompleteErrorReply(t *testing.T) {
	p, ln := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		http.Error(w, "bad input", http.StatusBadRequest)
	})
	for range 3 {
		var he *backend.HTTPError
		if _, err := p.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)}); !errors.As(err, &he) || he.Status != 400 || he.Body != "bad input\n" {
			t.Fatalf("Infer: %v, want HTTP 400 bad input", err)
		}
	}
	if n := ln.dialled.Load(); n != 1 {
		t.Fatalf("dialled %d connections, want 1", n)
	}
}

func TestPoolUndoesGzipLikeNetHTTP(t *testing.T) {
	p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("Accept-Encoding") != "gzip" {
			w.Write([]byte(`"no gzip asked"`))
			return
		}
		w.Header().Set("Content-Encoding", "gzip")
		zw := gzip.NewWriter(w)
		zw.Write([]byte(`{"zipped":true}`))
		zw.Close()
	})
	if got := mustInfer(t, p, `{}`); got != `{"zipped":true}` {
		t.Fatalf("got %s", got)
	}
}

func TestPoolClosedPoolKeepsNothing(t *testing.T) {
	p, ln := serve(t, echoHandler)
	mustInfer(t, p, `1`)
	p.conns.close()
	mustInfer(t, p, `2`) // still works: dials, and closes the connection after
	if n := idleConns(p); n != 0 {
		t.Fatalf("%d connections pooled after close", n)
	}
	if n := ln.dialled.Load(); n != 2 {
		t.Fatalf("dialled %d connections, want 2", n)
	}
}

func TestPoolLeavesLargeRequestsToNetHTTP(t *testing.T) {
	p, ln := serve(t, echoHandler)
	big := `"` + strings.Repeat("y", fastPathMaxBody) + `"`
	for range 2 {
		if got := mustInfer(t, p, big); got != big {
			t.Fatalf("echo of %d bytes came back as %d bytes", len(big), len(got))
		}
	}
	if n := idleConns(p); n != 0 {
		t.Fatalf("%d connections in the pool after large requests only", n)
	}
	if n := ln.dialled.Load(); n != 1 {
		t.Fatalf("dialled %d connections, want 1 (net/http keeps its own alive)", n)
	}
}

// http10Model is a model on Python's http.server as shipped: HTTP/1.0, so it closes
// the connection after every reply. It prints its port once it listens.
const http10Model = `
from http.server import BaseHTTPRequestHandler, HTTPServer

class H(BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass

srv = HTTPServer(("127.0.0.1", 0), H)
print(srv.server_address[1], flush=True)
srv.serve_forever()
`

func TestInferOnAModelThatClosesEveryConnection(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		testenv.Missing(t, "python3 on PATH: %v", err)
	}
	model := exec.Command(py, "-c", http10Model)
	out, err := model.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := model.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { model.Process.Kill(); model.Wait() })
	port, err := bufio.NewReader(out).ReadString('\n') // it listens once it says so
	if err != nil {
		t.Fatalf("model printed no port: %v", err)
	}
	p, err := New(Config{Addr: "127.0.0.1:" + strings.TrimSpace(port)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	for i := range 20 {
		in := fmt.Sprintf(`{"i":%d}`, i)
		if got := mustInfer(t, p, in); got != in {
			t.Fatalf("call %d: got %s, want %s", i, got, in)
		}
	}
	if n := idleConns(p); n != 0 {
		t.Fatalf("%d connections pooled from an HTTP/1.0 model", n)
	}
}

// waitFor is the shared poller (internal/testenv).
var waitFor = testenv.WaitFor
