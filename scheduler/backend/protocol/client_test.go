package protocol

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"

	"inferd/scheduler/backend"
	"inferd/store"
)

func TestNewAppliesProtocolDefaults(t *testing.T) {
	tests := []struct {
		protocol string
		want     []string // protocol, health path, infer path
	}{
		{"", []string{"http", "/healthz", "/"}},
		{"potassium", []string{"potassium", "/__status__", "/"}},
	}
	for _, tc := range tests {
		c, err := New(Config{Protocol: tc.protocol, Addr: "127.0.0.1:1"})
		if err != nil {
			t.Fatal(err)
		}
		got := []string{c.cfg.Protocol, c.cfg.HealthPath, c.cfg.InferPath}
		if !slices.Equal(got, tc.want) || c.cfg.MaxReplyBytes != 64<<20 {
			t.Errorf("protocol %q: defaults = %v, reply cap %d; want %v, 64 MiB", tc.protocol, got, c.cfg.MaxReplyBytes, tc.want)
		}
	}
}

func TestNewRejectsWhatCannotBeSpoken(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want string
	}{
		{"unknown protocol", Config{Protocol: "grpc"}, `unsupported protocol "grpc"`},
		{"relative health path", Config{HealthPath: "healthz"}, "health path"},
		{"relative infer path", Config{InferPath: "predict"}, "infer path"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := New(tc.cfg); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("New = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// The keep-alive pool must hold a connection for every call a replica may serve at
// once, or calls beyond it reconnect every time.
func TestKeepAlivePoolCoversMaxConcurrency(t *testing.T) {
	if maxIdleConns < store.MaxConcurrency {
		t.Errorf("maxIdleConns = %d, below store.MaxConcurrency %d", maxIdleConns, store.MaxConcurrency)
	}
}

func TestLastTracebackLine(t *testing.T) {
	for in, want := range map[string]string{
		"Traceback (most recent call last):\n  File \"x\"\nValueError: bad prompt\n\n": "ValueError: bad prompt",
		"  KeyError: 'x'  \r\n": "KeyError: 'x'",
		"":                      "",
	} {
		if got := lastTracebackLine(in); got != want {
			t.Errorf("lastTracebackLine(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestInferRefusesAReplyThatIsNotUTF8NamingTheByte(t *testing.T) {
	p, _ := serve(t, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("{\"text\":\"caf\xe9\"}")) // Latin-1, as a careless model writes it
	})
	_, err := p.Infer(context.Background(), backend.Request{Inputs: json.RawMessage(`{}`)})
	if !errors.Is(err, backend.ErrInvalidReply) || !strings.HasSuffix(err.Error(), "reply is not valid UTF-8 at byte 12") {
		t.Fatalf("Infer: %v", err)
	}
}
