package e2e

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"
)

// hookReceiver is a webhook destination on loopback: it answers the
// statuses it is given in turn (then 200) and hands each message it got to
// got.
type hookReceiver struct {
	srv      *http.Server
	url      string
	mu       sync.Mutex
	statuses []int
	got      chan hookMessage
}

type hookMessage struct {
	header http.Header
	body   []byte
}

// newHookReceiver serves on ln (a fresh loopback port when nil).
func newHookReceiver(t *testing.T, ln net.Listener, statuses ...int) *hookReceiver {
	t.Helper()
	if ln == nil {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			t.Fatal(err)
		}
	}
	r := &hookReceiver{statuses: statuses, got: make(chan hookMessage, 16), url: "http://" + ln.Addr().String() + "/hook"}
	r.srv = &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		status := 200
		if len(r.statuses) > 0 {
			status, r.statuses = r.statuses[0], r.statuses[1:]
		}
		r.mu.Unlock()
		r.got <- hookMessage{header: req.Header.Clone(), body: body}
		w.WriteHeader(status)
	})}
	go r.srv.Serve(ln)
	t.Cleanup(func() { r.srv.Close() })
	return r
}

func (r *hookReceiver) next(t *testing.T, within time.Duration) hookMessage {
	t.Helper()
	select {
	case m := <-r.got:
		return m
	case <-time.After(within):
		t.Fatalf("no webhook within %s", within)
		return hookMessage{}
	}
}

// verifyStandardWebhook checks a message's signature the way a receiver
// following the Standard Webhooks spec does, with nothing of inferd's code:
// HMAC-SHA256 over "id.timestamp.body", keyed with the base64-decoded
// secret after "whsec_".
func verifyStandardWebhook(t *testing.T, secret string, m hookMessage) {
	t.Helper()
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		t.Fatalf("secret %q is not whsec_<base64>: %v", secret, err)
	}
	id, ts := m.header.Get("webhook-id"), m.header.Get("webhook-timestamp")
	if id == "" || ts == "" {
		t.Fatalf("webhook-id %q / webhook-timestamp %q missing", id, ts)
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + ts + "."))
	mac.Write(m.body)
	want := "v1," + base64.StdEncoding.EncodeToString(mac.Sum(nil))
	found := false
	for _, sig := range strings.Fields(m.header.Get("webhook-signature")) {
		found = found || hmac.Equal([]byte(sig), []byte(want))
	}
	if !found {
		t.Errorf("webhook-signature %q does not verify with the team's secret", m.header.Get("webhook-signature"))
	}
}

// echoDaemon starts a daemon on a fresh data dir with the extra config,
// team acme's key and its project echo (modelKey mk-echo, one replica
// kept), and returns them with the config's path.
func echoDaemon(t *testing.T, extra string) (d *daemon, key, cfg string) {
	t.Helper()
	echo := echoDir(t)
	dir, cfg := newDaemonDir(t, extra)
	d = startDaemon(t, dir, cfg)
	key = d.createKey("acme", false)
	d.apply("projects:\n" + echoProject("echo", "acme", "mk-echo", echo, marker(), "") + "    minReplicas: 1\n")
	return d, key, cfg
}

func TestWebhooksAreSignedRetriedAndRefusedForMetadata(t *testing.T) {
	t.Parallel()
	d, key, _ := echoDaemon(t, "startWait: 20s\nwebhook:\n  firstRetry: 200ms\n  timeout: 30s\n")
	out, err := d.cli("team", "webhook-secret", "acme")
	if err != nil {
		t.Fatal(err)
	}
	secret := strings.TrimSpace(out)
	start := func(inputs, extra string, startOnly bool) map[string]any {
		t.Helper()
		body := fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","startOnly":%t,"modelInputs":%s%s}`, key, startOnly, inputs, extra)
		status, r := do(t, "POST", d.base+"/start/v4", nil, body)
		if status != 200 {
			t.Fatalf("start: HTTP %d %v", status, r)
		}
		return r
	}

	t.Run("a receiver that fails twice gets the third attempt, signed, under one id", func(t *testing.T) {
		rcv := newHookReceiver(t, nil, 500, 503)
		r := start(`{"n":7}`, fmt.Sprintf(`,"webhook":%q`, rcv.url), true)
		callID := r["callID"].(string)
		var msgs []hookMessage
		for range 3 {
			msgs = append(msgs, rcv.next(t, 60*time.Second))
		}
		for i, m := range msgs {
			if m.header.Get("webhook-id") != msgs[0].header.Get("webhook-id") {
				t.Errorf("attempt %d has webhook-id %q, the first %q", i+1, m.header.Get("webhook-id"), msgs[0].header.Get("webhook-id"))
			}
			verifyStandardWebhook(t, secret, m)
		}
		var body map[string]any
		if err := json.Unmarshal(msgs[2].body, &body); err != nil {
			t.Fatal(err)
		}
		if body["event"] != "completed" || body["callID"] != callID || body["message"] != "success" || body["finished"] != true {
			t.Errorf("body %s", msgs[2].body)
		}
		if out := output(t, body); out["echo"].(map[string]any)["n"] != 7.0 {
			t.Errorf("modelOutputs %v", body["modelOutputs"])
		}
		select {
		case m := <-rcv.got:
			t.Errorf("a fourth delivery after a 200: %s", m.body)
		case <-time.After(time.Second):
		}
		eventually(t, 10*time.Second, "the status page counts the delivery and its retries", func() bool {
			_, st := do(t, "GET", d.base+"/v1/status", map[string]string{"X-Service-API-Key": key}, "")
			w, _ := st["webhooks"].(map[string]any)
			return w != nil && w["delivered"] == 1.0 && w["retries"] == 2.0 && w["pending"] == 0.0
		})
	})

	t.Run("a webhook to the metadata address is refused at start", func(t *testing.T) {
		for _, u := range []string{"http://169.254.169.254/latest/meta-data/", "http://metadata.google.internal/"} {
			r := start(`{}`, fmt.Sprintf(`,"webhook":%q`, u), true)
			msg, _ := r["message"].(string)
			if !strings.HasPrefix(msg, "error: webhook destination not allowed") || r["callID"] != "" {
				t.Errorf("start with webhook %s: %v; want refused with no call", u, r)
			}
		}
	})
	t.Run("a hanging receiver delays neither a call nor the shutdown", func(t *testing.T) {
		hang := make(chan struct{})
		defer close(hang)
		arrived := make(chan struct{}, 4)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		srv := &http.Server{Handler: http.HandlerFunc(func(http.ResponseWriter, *http.Request) {
			arrived <- struct{}{}
			<-hang
		})}
		go srv.Serve(ln)
		defer srv.Close()
		began := time.Now()
		r := start(`{"n":1}`, fmt.Sprintf(`,"webhook":"http://%s/","webhookEvents":["start","completed"]`, ln.Addr()), false)
		if r["message"] != "success" {
			t.Fatalf("sync start with a hanging webhook: %v", r)
		}
		if took := time.Since(began); took > 10*time.Second {
			t.Errorf("the start took %s", took)
		}
		select {
		case <-arrived: // an attempt is in flight, and webhook.timeout is 30s
		case <-time.After(30 * time.Second):
			t.Fatal("the webhook never arrived")
		}
		began = time.Now()
		d.stop()
		if took := time.Since(began); took > 15*time.Second {
			t.Errorf("shutdown with a webhook in flight took %s", took)
		}
	})

}

// A call that completed while its receiver was down, and whose daemon was
// then killed with SIGKILL, is delivered after the restart: the message was
// committed with the call's result.
func TestWebhookSurvivesKill9BetweenCompletionAndDelivery(t *testing.T) {
	t.Parallel()
	d, key, cfg := echoDaemon(t, "startWait: 20s\nwebhook:\n  firstRetry: 100ms\n")
	port := freePort(t) // nothing listens there yet: every attempt fails
	body := fmt.Sprintf(`{"apiKey":%q,"modelKey":"mk-echo","modelInputs":{"n":3},"webhook":"http://127.0.0.1:%d/hook"}`, key, port)
	_, r := do(t, "POST", d.base+"/start/v4", nil, body)
	if r["message"] != "success" {
		t.Fatalf("start: %v", r)
	}
	callID := r["callID"].(string)
	d.kill()

	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	rcv := newHookReceiver(t, ln)
	startDaemon(t, d.dir, cfg)
	m := rcv.next(t, 60*time.Second)
	var got map[string]any
	if err := json.Unmarshal(m.body, &got); err != nil {
		t.Fatal(err)
	}
	if got["callID"] != callID || got["event"] != "completed" || got["message"] != "success" {
		t.Errorf("delivered after the restart: %s", m.body)
	}
	if id := m.header.Get("webhook-id"); !strings.HasPrefix(id, "msg_") || !strings.HasSuffix(id, "_completed") {
		t.Errorf("webhook-id %q", id)
	}
	secret, err := runCLI(cfg, "team", "webhook-secret", "acme")
	if err != nil {
		t.Fatal(err)
	}
	verifyStandardWebhook(t, strings.TrimSpace(secret), m)
}
