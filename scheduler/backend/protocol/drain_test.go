package protocol

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"inferd/scheduler/backend"
	"inferd/store"
)

// lateEndModel is an OpenAI server that sends a stream's data: [DONE]
// before it ends the stream's chunked body, as uvicorn does in two writes.
// A request with "stream": true gets one chunk, then [DONE], then the
// body's end (the zero-length chunk) when end says so; any other request
// gets {"ok":true}. Connections are kept alive. runs counts the requests
// that reached it, by their "id".
type lateEndModel struct {
	ln   *countingListener
	runs sync.Map // id -> *atomic.Int64
	// end returns once a stream's body may end. arrived is closed once
	// the connection's next bytes (the client's next request) or its close
	// arrived; answered gets a value each time a plain request was
	// answered, on any connection.
	end      func(arrived, answered <-chan struct{})
	answered chan struct{}
}

func newLateEndModel(t *testing.T, end func(arrived, answered <-chan struct{})) *lateEndModel {
	t.Helper()
	m := &lateEndModel{ln: listen(t), end: end, answered: make(chan struct{}, 1)}
	go func() {
		for {
			conn, err := m.ln.Accept()
			if err != nil {
				return
			}
			go m.serve(conn)
		}
	}()
	return m
}

func (m *lateEndModel) serve(conn net.Conn) {
	defer conn.Close()
	br := bufio.NewReader(conn)
	for {
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		var in struct {
			ID     string `json:"id"`
			Stream bool   `json:"stream"`
		}
		if err := json.NewDecoder(req.Body).Decode(&in); err != nil {
			return
		}
		io.Copy(io.Discard, req.Body)
		n, _ := m.runs.LoadOrStore(in.ID, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		if !in.Stream {
			io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
			select {
			case m.answered <- struct{}{}:
			default:
			}
			continue
		}
		chunk := func(s string) string { return fmt.Sprintf("%x\r\n%s\r\n", len(s), s) }
		if _, err := io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
			chunk(`data: {"choices":[{"delta":{"content":"`+in.ID+`"}}]}`+"\n\n")+chunk("data: [DONE]\n\n")); err != nil {
			return
		}
		// Whether the client sends its next request on this connection
		// before the body ended: the peek ends before the loop reads on.
		arrived := make(chan struct{})
		go func() {
			br.Peek(1)
			close(arrived)
		}()
		m.end(arrived, m.answered)
		if _, err := io.WriteString(conn, "0\r\n\r\n"); err != nil {
			return
		}
		<-arrived
	}
}

// ranOnce reports the ids that did not reach the model exactly once.
func (m *lateEndModel) ranOnce(ids []string) []string {
	var bad []string
	for _, id := range ids {
		n, ok := m.runs.Load(id)
		if !ok || n.(*atomic.Int64).Load() != 1 {
			bad = append(bad, id)
		}
	}
	return bad
}

func lateEndClient(t *testing.T, m *lateEndModel) *Client {
	t.Helper()
	c := poolClient(t, m.ln)
	c.openai = true
	c.cfg.Protocol = store.ProtocolOpenAI
	return c
}

// inferStream makes one streamed call and returns its chunks.
func inferStream(ctx context.Context, c *Client, id string) (string, error) {
	out, err := c.Infer(ctx, backend.Request{Route: "/v1/chat/completions", Inputs: json.RawMessage(`{"stream":true,"id":"` + id + `"}`)})
	return string(out), err
}

// A stream's connection goes back to the pool only once its body has
// ended, not at its [DONE]: the next call never reads the rest of the
// last one's body as its own answer (the 502 `malformed HTTP response
// "0"` that made the SDKs send a call twice), whether the body ends long
// after [DONE] or right after it.
func TestStreamEndingItsBodyAfterDoneLeavesTheNextCallItsOwnConnection(t *testing.T) {
	tests := []struct {
		name string
		// end is when the model ends a stream's body after [DONE].
		end func(arrived, answered <-chan struct{})
		// workers and streams: how many at once, and each one's streams;
		// each stream is followed by a plain call on the same client.
		workers, streams int
	}{
		// As with a gap of 200 ms: the body ends only after the client's
		// next call has been sent (on this connection) or answered (on
		// another).
		{"the body ends after a gap", func(arrived, answered <-chan struct{}) {
			select {
			case <-arrived:
			case <-answered:
			}
		}, 1, 3},
		// A second write right after [DONE], at c=16.
		{"the body ends at once, 16 at a time", func(_, _ <-chan struct{}) {}, 16, 40},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := newLateEndModel(t, tt.end)
			c := lateEndClient(t, m)
			var (
				mu   sync.Mutex
				ids  []string
				errs []string
				wg   sync.WaitGroup
			)
			for w := range tt.workers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range tt.streams {
						id := fmt.Sprintf("w%d-s%d", w, i)
						out, err := inferStream(context.Background(), c, id)
						if err == nil && !strings.Contains(out, id) {
							err = fmt.Errorf("chunks %s", out)
						}
						plain := id + "-plain"
						reply, perr := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{"id":"` + plain + `"}`)})
						if perr == nil && string(reply) != `{"ok":true}` {
							perr = fmt.Errorf("reply %s", reply)
						}
						mu.Lock()
						ids = append(ids, id, plain)
						if err != nil {
							errs = append(errs, fmt.Sprintf("stream %s: %v", id, err))
						}
						if perr != nil {
							errs = append(errs, fmt.Sprintf("call %s after it: %v", plain, perr))
						}
						mu.Unlock()
					}
				}()
			}
			wg.Wait()
			if len(errs) > 0 {
				t.Fatalf("%d of %d calls failed, e.g. %s", len(errs), len(ids), errs[0])
			}
			if bad := m.ranOnce(ids); len(bad) > 0 {
				t.Fatalf("calls that did not reach the model once: %v", bad)
			}
		})
	}
}

// A stream's connection whose body ends after [DONE] is pooled once it has
// ended, and carries later calls; one whose server sends more than the end
// after [DONE], or never ends it, is closed, never pooled.
func TestStreamConnectionIsPooledOnlyOnceItsBodyEnded(t *testing.T) {
	tests := []struct {
		name string
		// after is what the model sends once it sent [DONE]; hold: and
		// then keeps the connection open without ending the body.
		after  string
		hold   bool
		pooled bool
	}{
		{"the body's end", "0\r\n\r\n", false, true},
		{"more than the end", fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", drainBytes+1, strings.Repeat(":", drainBytes+1)), false, false},
		{"nothing, ever", "", true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ln := listen(t)
			gate := make(chan struct{})
			closed := make(chan struct{})
			go func() {
				conn, err := ln.Accept()
				if err != nil {
					return
				}
				defer conn.Close()
				br := bufio.NewReader(conn)
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						close(closed)
						return
					}
					stream := strings.Contains(req.URL.Path, "stream")
					io.Copy(io.Discard, req.Body)
					if !stream {
						io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\ntrue")
						continue
					}
					io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"+
						"e\r\ndata: [DONE]\n\n\r\n")
					<-gate // Infer has returned
					io.WriteString(conn, tt.after)
					if tt.hold {
						io.Copy(io.Discard, br) // until the client closes
						close(closed)
						return
					}
				}
			}()
			c := lateEndClient(t, &lateEndModel{ln: ln})
			if out, err := c.Infer(context.Background(), backend.Request{Route: "/stream", Inputs: json.RawMessage(`{"stream":true}`)}); err != nil || string(out) != "[]" {
				t.Fatalf("Infer = %s, %v; want the stream's empty array", out, err)
			}
			close(gate)
			if !tt.pooled {
				if !tt.hold {
					waitFor(t, "the drain to close the connection or pool it", func() bool {
						select {
						case <-closed:
							return true
						default:
							return idleConns(c) > 0
						}
					})
				}
				if n := idleConns(c); n != 0 {
					t.Fatalf("%d connections pooled", n)
				}
				c.Close() // ends the drain of a body that never ends
				<-closed
				return
			}
			waitFor(t, "the drained connection to be pooled", func() bool { return idleConns(c) == 1 })
			if got := mustInfer(t, c, `{}`); got != "true" {
				t.Fatalf("the next call got %s", got)
			}
			if n := ln.dialled.Load(); n != 1 {
				t.Fatalf("dialled %d connections, want 1 (the drained one reused)", n)
			}
		})
	}
}
