package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"inferd/internal/testenv"
)

// TestOpenAIHeldRequestsCountAgainstTheKeysCaps: on the OpenAI routes a
// streamed request is one of its key's event streams and a plain one held
// open one of its key's waits (docs/openai.md "Streaming", docs/security.md
// "Budgets"): with limits.maxStreamsPerKey at 2 and maxWaitsPerKey at 3, a
// key holding two streams open has a third refused with 429 (a stream
// counted as a mere wait would pass), one holding three plain requests
// open a fourth; another key is not held back, and a stream that ends
// frees its place.
func TestOpenAIHeldRequestsCountAgainstTheKeysCaps(t *testing.T) {
	t.Parallel()
	mock, _ := filepath.Abs("examples/openai-mock")
	echoDir(t) // python3 is needed
	dir, cfg := newDaemonDir(t, "limits:\n  maxStreamsPerKey: 2\n  maxWaitsPerKey: 3\n")
	d := startDaemon(t, dir, cfg)
	streamer, waiter, other := d.createKey("llm", false), d.createKey("llm", false), d.createKey("llm", false)
	d.apply("projects:\n" + openaiProject("chat", "llm", mock, "", "    concurrency: 8\n    minReplicas: 1\n    maxReplicas: 1\n"))

	// stream opens a streamed chat that the model holds open after its
	// first chunk; it returns the status and, for a 200, a close that
	// ends the stream (the client goes away).
	stream := func(t *testing.T, key string) (int, func()) {
		t.Helper()
		ctx, cancel := context.WithCancel(context.Background())
		body := `{"model":"chat","stream":true,"mock_hold":true,"messages":[{"role":"user","content":"one two"}]}`
		req, err := http.NewRequestWithContext(ctx, "POST", d.base+"/v1/chat/completions", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Authorization", "Bearer "+key)
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			cancel()
			t.Fatalf("a streamed chat: %v", err)
		}
		if resp.StatusCode != http.StatusOK {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			cancel()
			return resp.StatusCode, func() {}
		}
		// The stream is open once its first chunk is in.
		line, err := bufio.NewReader(resp.Body).ReadString('\n')
		if err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("a streamed chat's first line: %q, %v", line, err)
		}
		closed := false
		end := func() {
			if !closed {
				closed = true
				cancel()
				resp.Body.Close()
			}
		}
		t.Cleanup(end)
		return resp.StatusCode, end
	}

	// The model answers once its replica is up.
	eventually(t, time.Minute, "chat's replica ready", func() bool {
		s := d.replicaStates(streamer, "chat")
		return len(s) == 1 && s[0] == "ready"
	})

	t.Run("a key's third stream is refused while two are open", func(t *testing.T) {
		_, first := stream(t, streamer)
		stream(t, streamer)
		if status, _ := stream(t, streamer); status != http.StatusTooManyRequests {
			t.Errorf("a third stream of one key with maxStreamsPerKey 2: HTTP %d, want 429", status)
		}
		if status, end := stream(t, other); status != http.StatusOK {
			t.Errorf("another key's stream while the first holds two: HTTP %d, want 200", status)
		} else {
			end()
		}
		first()
		// The first stream's place is free once the daemon has seen its
		// client go: a new stream then opens.
		eventually(t, 30*time.Second, "a stream of the key to open again once one of its two ended", func() bool {
			status, end := stream(t, streamer)
			end()
			return status == http.StatusOK
		})
	})

	t.Run("a key's fourth held request is refused while three wait", func(t *testing.T) {
		// Three plain requests the model holds (its reply in 10 minutes);
		// their clients go away once the fourth is refused, which ends
		// their waits (the calls run on, as the server's).
		ctx, leave := context.WithCancel(context.Background())
		done := make(chan error, 3)
		for range 3 {
			go func() {
				body := fmt.Sprintf(`{"model":"chat","mock_delay_ms":%d,"messages":[{"role":"user","content":"slow"}]}`, testenv.Scale(10*time.Minute).Milliseconds())
				req, err := http.NewRequestWithContext(ctx, "POST", d.base+"/v1/chat/completions", strings.NewReader(body))
				if err != nil {
					done <- err
					return
				}
				req.Header.Set("Authorization", "Bearer "+waiter)
				resp, err := http.DefaultClient.Do(req)
				if err == nil {
					resp.Body.Close()
					err = fmt.Errorf("a held request was answered: HTTP %d", resp.StatusCode)
				}
				done <- err
			}()
		}
		defer func() {
			leave()
			for range 3 {
				<-done // the client left: the request is over, its wait free
			}
		}()
		eventually(t, time.Minute, "the three held requests running", func() bool {
			return runningOf(t, d.base, waiter, "chat") == 3
		})
		status, body := doRaw(t, "POST", d.base+"/v1/chat/completions", map[string]string{"Authorization": "Bearer " + waiter},
			`{"model":"chat","messages":[{"role":"user","content":"one more"}]}`)
		if status != http.StatusTooManyRequests {
			t.Errorf("a fourth held request of one key with maxWaitsPerKey 3: HTTP %d %s, want 429", status, body)
		}
	})
}

// runningOf is how many calls of project /v1/status/projects shows running
// to key.
func runningOf(t *testing.T, base, key, project string) int {
	t.Helper()
	status, body := doRaw(t, "GET", base+"/v1/status/projects", map[string]string{"X-Service-API-Key": key}, "")
	var all struct {
		Results []struct {
			ID      string `json:"id"`
			Running int    `json:"running"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &all); status != http.StatusOK || err != nil {
		t.Fatalf("/v1/status/projects: HTTP %d %v %s", status, err, body)
	}
	for _, p := range all.Results {
		if p.ID == project {
			return p.Running
		}
	}
	return 0
}
