package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"inferd/scheduler/backend"
)

// lines is a backend.Stream that hands each line to a channel.
type lines struct {
	began bool
	got   chan string
}

func (l *lines) Begin()                 { l.began = true }
func (l *lines) Line(b json.RawMessage) { l.got <- string(b) }

func TestStreamedReplyReachesTheStreamLineByLine(t *testing.T) {
	gate := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson; charset=utf-8")
		w.Write([]byte(`{"token":"a"}` + "\n"))
		w.(http.Flusher).Flush()
		<-gate // the rest only once the test has seen the first line
		w.Write([]byte("\n" + `{"token":"b"}` + "\n" + `[1,2]`))
	}))
	defer srv.Close()
	c, err := New(Config{Addr: strings.TrimPrefix(srv.URL, "http://")})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s := &lines{got: make(chan string, 4)}
	type result struct {
		out json.RawMessage
		err error
	}
	res := make(chan result, 1)
	go func() {
		out, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`), Stream: s})
		res <- result{out, err}
	}()
	if first := <-s.got; first != `{"token":"a"}` {
		t.Fatalf("first line %s", first)
	}
	close(gate)
	r := <-res
	if r.err != nil || string(r.out) != `[{"token":"a"},{"token":"b"},[1,2]]` {
		t.Fatalf("Infer = %s, %v; want the array of the lines", r.out, r.err)
	}
	if !s.began || <-s.got != `{"token":"b"}` || <-s.got != `[1,2]` {
		t.Errorf("the stream missed Begin or the later lines")
	}
}

func TestStreamedReplyWithALineThatIsNotJSONIsInvalid(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		w.Write([]byte("{\"ok\":1}\nnot json\n"))
	}))
	defer srv.Close()
	c, _ := New(Config{Addr: strings.TrimPrefix(srv.URL, "http://")})
	defer c.Close()
	_, err := c.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)}) // no Stream: still read
	if !errors.Is(err, backend.ErrInvalidReply) || !strings.Contains(err.Error(), "line 2") {
		t.Fatalf("Infer = %v, want an invalid reply naming line 2", err)
	}
}
