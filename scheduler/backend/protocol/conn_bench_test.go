package protocol

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"testing"

	"inferd/scheduler/backend"
)

// BenchmarkInferHop compares one POST and its reply to a kept-alive server through
// Infer (connPool) and through net/http's Transport (what Infer used before), at c=1 and
// with parallel callers. The server runs in the same process, so both pay for it
// alike; the difference is the client side.
func BenchmarkInferHop(b *testing.B) {
	inputs := []byte(`{"prompt":"hello"}`)
	noop := func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"ok":true}`))
	}
	viaPool := func(p *Client) error {
		out, err := p.Infer(context.Background(), backend.Request{Inputs: inputs})
		if err == nil && len(out) == 0 {
			err = errors.New("empty reply")
		}
		return err
	}
	viaTransport := func(p *Client) error {
		req, err := http.NewRequestWithContext(context.Background(), http.MethodPost, p.baseURL+"/", bytes.NewReader(inputs))
		if err != nil {
			return err
		}
		req.Header.Set("Content-Type", "application/json")
		resp, err := p.client.Do(req)
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(io.LimitReader(resp.Body, maxReplyBytes+1))
		if err == nil && len(body) == 0 {
			err = errors.New("empty reply")
		}
		return err
	}
	for _, c := range []struct {
		name string
		send func(*Client) error
	}{{"pool", viaPool}, {"net-http", viaTransport}} {
		one := func(b *testing.B, p *Client) {
			if err := c.send(p); err != nil {
				b.Error(err) // Error, not Fatal: RunParallel's goroutines call this too
			}
		}
		b.Run(c.name+"/c=1", func(b *testing.B) {
			p, _ := serve(b, noop)
			p.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: maxIdleConns}}
			b.ReportAllocs()
			for b.Loop() {
				one(b, p)
			}
		})
		b.Run(c.name+"/parallel", func(b *testing.B) {
			p, _ := serve(b, noop)
			p.client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: maxIdleConns}}
			b.ReportAllocs()
			b.SetParallelism(32)
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					one(b, p)
				}
			})
		})
	}
}
