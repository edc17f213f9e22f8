package protocol

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"inferd/scheduler/backend"
)

// A model is not trusted: these tests are the model side of docs/security.md.

// inputsOf returns call inputs of about n bytes: small ones go through the
// connection pool, large ones through net/http (see fastPathMaxBody), and
// both paths must hold.
func inputsOf(n int) json.RawMessage {
	return json.RawMessage(`{"x":"` + strings.Repeat("i", n) + `"}`)
}

var bodySizes = []struct {
	name string
	n    int
}{
	{"small inputs (pool)", 10},
	{"large inputs (net/http)", fastPathMaxBody + 1},
}

func TestInferAnswersARedirectAsTheModelsErrorAndSendsNothingToItsTarget(t *testing.T) {
	var fetched atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fetched.Add(1)
		w.Write([]byte(`{"stolen": true}`))
	}))
	t.Cleanup(target.Close)
	for _, code := range []int{301, 302, 303, 307, 308} {
		for _, size := range bodySizes {
			t.Run(fmt.Sprintf("%d %s", code, size.name), func(t *testing.T) {
				p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
					http.Redirect(w, r, target.URL+"/collect", code)
				})
				_, err := p.Infer(context.Background(), backend.Request{Inputs: inputsOf(size.n)})
				var httpErr *backend.HTTPError
				if !errors.As(err, &httpErr) || httpErr.Status != code {
					t.Fatalf("Infer = %v, want the model's HTTP %d as an HTTPError", err, code)
				}
				if n := fetched.Load(); n != 0 {
					t.Fatalf("the redirect target was fetched %d times", n)
				}
			})
		}
	}
}

func TestHealthyIsFalseForARedirect(t *testing.T) {
	p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, "/elsewhere", http.StatusTemporaryRedirect)
	})
	if p.Healthy(context.Background()) {
		t.Fatal("a model answering its health check with a redirect counts as healthy")
	}
}

// endlessHeaderModel accepts connections and answers each request with a
// status line and one header that never ends, until the client hangs up. It
// returns its address and a count of the header bytes it managed to send.
func endlessHeaderModel(t *testing.T) (addr string, sent *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	sent = new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				http.ReadRequest(bufio.NewReader(c)) // whatever it is, answer the same
				c.Write([]byte("HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nX-Huge: "))
				chunk := []byte(strings.Repeat("h", 64<<10))
				for {
					n, err := c.Write(chunk)
					sent.Add(int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), sent
}

func TestInferRefusesAReplyWithHeadersOverTheCap(t *testing.T) {
	for _, size := range bodySizes {
		t.Run(size.name, func(t *testing.T) {
			addr, sent := endlessHeaderModel(t)
			p, err := New(Config{Addr: addr})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(p.Close)
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			_, err = p.Infer(ctx, backend.Request{Inputs: inputsOf(size.n)})
			if !errors.Is(err, backend.ErrInvalidReply) || !strings.Contains(err.Error(), "headers larger than") {
				t.Fatalf("Infer = %v, want an invalid reply for its headers", err)
			}
			// The model could send far more; inferd stopped reading near the
			// cap (plus what the socket buffers held).
			if n := sent.Load(); n > 64*maxHeaderBytes {
				t.Fatalf("the model got %d header bytes through before inferd gave up", n)
			}
		})
	}
}

func TestHealthyIsFalseForHeadersOverTheCap(t *testing.T) {
	addr, _ := endlessHeaderModel(t)
	p, err := New(Config{Addr: addr})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	if p.Healthy(context.Background()) {
		t.Fatal("a health reply with an endless header counts as healthy")
	}
}

func TestInferReadsAReplyOfKnownLengthIntoOneBufferOfThatSize(t *testing.T) {
	reply := `{"y":"` + strings.Repeat("r", 100<<10) + `"}`
	p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(len(reply)))
		w.Write([]byte(reply))
	})
	out, err := p.Infer(context.Background(), backend.Request{Inputs: inputsOf(10)})
	if err != nil || string(out) != reply {
		t.Fatalf("Infer = %d bytes, %v", len(out), err)
	}
	// A buffer grown as the reply came would have room to spare; one made
	// for the declared length has none.
	if cap(out) != len(reply) {
		t.Fatalf("reply buffer has capacity %d for %d bytes", cap(out), len(reply))
	}
}

func TestInferRefusesADeclaredLengthOverTheCapWithoutReadingIt(t *testing.T) {
	p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", fmt.Sprint(int64(1)<<40))
		w.WriteHeader(http.StatusOK)
		w.(http.Flusher).Flush()
		<-r.Context().Done() // send nothing: the client must not wait for it
	})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := p.Infer(ctx, backend.Request{Inputs: inputsOf(10)})
	if !errors.Is(err, backend.ErrInvalidReply) || !strings.Contains(err.Error(), "reply larger than") {
		t.Fatalf("Infer = %v, want an invalid reply for its size", err)
	}
}
