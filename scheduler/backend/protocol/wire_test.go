package protocol

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"

	"inferd/scheduler/backend"
	"inferd/store"
)

// rawModel accepts one connection at a time, keeps the bytes of each request
// as they came, and answers {"ok":true}.
func rawModel(t *testing.T) (addr string, requests <-chan []byte) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got := make(chan []byte, 16)
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				var raw bytes.Buffer
				br := bufio.NewReader(io.TeeReader(conn, &raw))
				for {
					req, err := http.ReadRequest(br)
					if err != nil {
						return
					}
					io.Copy(io.Discard, req.Body)
					got <- bytes.Clone(raw.Bytes()[:raw.Len()-br.Buffered()])
					raw.Next(raw.Len() - br.Buffered())
					io.WriteString(conn, "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 11\r\n\r\n{\"ok\":true}")
				}
			}()
		}
	}()
	return ln.Addr().String(), got
}

// netHTTPBytes is the request net/http's client writes for the same call, as
// the transport sends it (it asks for gzip).
func netHTTPBytes(t *testing.T, method, url string, body []byte, header http.Header) []byte {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, url, r)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range header {
		req.Header[k] = v
	}
	req.Header.Set("Accept-Encoding", "gzip")
	var buf bytes.Buffer
	if err := req.Write(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// A model sees, byte for byte, the request net/http's client would have sent:
// the pool writes requests itself (requestHead), so nothing a model relies
// on (headers, their order, the target's escaping) may differ.
func TestModelSeesWhatNetHTTPWouldSend(t *testing.T) {
	addr, requests := rawModel(t)
	inputs := json.RawMessage(`{"prompt":"hello"}`)
	next := func() string {
		select {
		case b := <-requests:
			return string(b)
		default:
			t.Fatal("the model got no request")
			return ""
		}
	}
	c, err := New(Config{Addr: addr, HealthPath: "/health/check?deep=1", InferPath: "/v1/predict"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)

	if status, err := c.Health(context.Background()); err != nil || status != 200 {
		t.Fatalf("Health = %d, %v", status, err)
	}
	if got, want := next(), string(netHTTPBytes(t, "GET", "http://"+addr+"/health/check?deep=1", nil, nil)); got != want {
		t.Errorf("health check:\n got %q\nwant %q", got, want)
	}
	jsonHeader := http.Header{"Content-Type": {"application/json"}}
	if _, err := c.Infer(context.Background(), backend.Request{Inputs: inputs}); err != nil {
		t.Fatal(err)
	}
	if got, want := next(), string(netHTTPBytes(t, "POST", "http://"+addr+"/v1/predict", inputs, jsonHeader)); got != want {
		t.Errorf("call:\n got %q\nwant %q", got, want)
	}
	if _, err := c.Infer(context.Background(), backend.Request{Inputs: inputs, Route: "/résumé"}); err != nil {
		t.Fatal(err)
	}
	if got, want := next(), string(netHTTPBytes(t, "POST", "http://"+addr+"/v1/predict/résumé", inputs, jsonHeader)); got != want {
		t.Errorf("call with a route:\n got %q\nwant %q", got, want)
	}

	k, err := New(Config{Addr: addr, Protocol: store.ProtocolPotassium})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(k.Close)
	if _, err := k.Infer(context.Background(), backend.Request{Inputs: inputs}); err != nil {
		t.Fatal(err)
	}
	got := next()
	i := strings.Index(got, "X-Banana-Request-Id: ")
	if i < 0 {
		t.Fatalf("potassium call without X-Banana-Request-Id:\n%q", got)
	}
	id := got[i+len("X-Banana-Request-Id: "):]
	id = id[:strings.Index(id, "\r\n")]
	jsonHeader["X-Banana-Request-Id"] = []string{id}
	if want := string(netHTTPBytes(t, "POST", "http://"+addr+"/", inputs, jsonHeader)); got != want {
		t.Errorf("potassium call:\n got %q\nwant %q", got, want)
	}
}
