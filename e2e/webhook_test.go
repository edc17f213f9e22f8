package e2e

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"inferd/internal/testenv"
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
	at     time.Time // when it arrived
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
		r.got <- hookMessage{header: req.Header.Clone(), body: body, at: time.Now()}
		w.WriteHeader(status)
	})}
	go r.srv.Serve(ln)
	t.Cleanup(func() { r.srv.Close() })
	return r
}

// next is the next message, or fails t after within (stretched by
// testenv.Scale on a busy machine).
func (r *hookReceiver) next(t *testing.T, within time.Duration) hookMessage {
	t.Helper()
	select {
	case m := <-r.got:
		return m
	case <-scaledAfter(within):
		t.Fatal(testenv.Waited(within, "a webhook at "+r.url))
		return hookMessage{}
	}
}

// verifyStandardWebhook checks a message the way a receiver following the
// Standard Webhooks spec does when it arrives, with nothing of inferd's
// code: the signature over "id.timestamp.body" with the team's secret, and
// a timestamp of the current Unix seconds, within tolerance.
func verifyStandardWebhook(t *testing.T, secret string, m hookMessage) {
	t.Helper()
	if err := testenv.VerifyStandardWebhook(secret, m.header, m.body, m.at); err != nil {
		t.Errorf("webhook %s: %v", m.header.Get("webhook-id"), err)
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
	// A webhook attempt lasts up to webhook.timeout: longer than any bound
	// on a start or a shutdown below, however busy the machine.
	const attemptLimit = 60 * time.Second
	d, key, _ := echoDaemon(t, "startWait: "+scaledSetting(20*time.Second)+"\nwebhook:\n  firstRetry: 200ms\n  timeout: "+scaledSetting(attemptLimit)+"\n")
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
		if took := time.Since(began); took > testenv.Scale(attemptLimit/6) {
			t.Errorf("the start took %s; webhook.timeout is %s [%s]", took, testenv.Scale(attemptLimit), testenv.Load())
		}
		select {
		case <-arrived: // an attempt is in flight, for up to webhook.timeout
		case <-scaledAfter(30 * time.Second):
			t.Fatal(testenv.Waited(30*time.Second, "the webhook to arrive"))
		}
		began = time.Now()
		d.stop()
		if took := time.Since(began); took > testenv.Scale(attemptLimit/4) {
			t.Errorf("shutdown with a webhook in flight took %s; webhook.timeout is %s [%s]", took, testenv.Scale(attemptLimit), testenv.Load())
		}
	})

}

// A call that completed while its receiver was down, and whose daemon was
// then killed with SIGKILL, is delivered after the restart: the message was
// committed with the call's result.
func TestWebhookSurvivesKill9BetweenCompletionAndDelivery(t *testing.T) {
	t.Parallel()
	d, key, cfg := echoDaemon(t, "startWait: "+scaledSetting(20*time.Second)+"\nwebhook:\n  firstRetry: 100ms\n")
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

// hangingReceiver holds every request it gets until the request is given
// up (the attempt's webhook.timeout) or the test ends, and counts how many
// it holds at once.
type hangingReceiver struct {
	url     string
	arrived chan struct{}
	mu      sync.Mutex
	holding int
	most    int
}

func newHangingReceiver(t *testing.T) *hangingReceiver {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	r := &hangingReceiver{url: "http://" + ln.Addr().String() + "/hook", arrived: make(chan struct{}, 64)}
	srv := &http.Server{Handler: http.HandlerFunc(func(_ http.ResponseWriter, req *http.Request) {
		r.mu.Lock()
		r.holding++
		r.most = max(r.most, r.holding)
		r.mu.Unlock()
		r.arrived <- struct{}{}
		<-req.Context().Done() // the sender gave up, or Close at the test's end
		r.mu.Lock()
		r.holding--
		r.mu.Unlock()
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return r
}

func (r *hangingReceiver) mostHeld() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.most
}

// #27, with the real binary: team acme's receiver never answers, and team
// beta's webhook still arrives at once (acme holds its share of the
// senders, no more); an allow-listed name that resolves to the metadata
// address, or to its NAT64 form, is refused when it is dialed.
func TestWebhookTeamsDoNotDelayEachOtherAndMetadataNamesAreRefused(t *testing.T) {
	t.Parallel()
	echo := echoDir(t)
	// The attempts to the hanging receiver last webhook.timeout (60s,
	// stretched on a busy machine): beta's message arriving before then
	// did not wait for one of them.
	dir, cfg := newDaemonDir(t, "startWait: "+scaledSetting(20*time.Second)+"\nwebhook:\n  senders: 4\n  sendersPerTeam: 2\n  timeout: "+scaledSetting(60*time.Second)+"\n"+
		"  firstRetry: 1m\n  allow: [127.0.0.0/8, \"*.example\"]\n")
	d := startDaemonWith(t, dir, cfg, failpointBinary(t), "INFERD_REPLICA_USER=root",
		"INFERD_WEBHOOK_HOSTS=meta.example=169.254.169.254,nat.example=64:ff9b::a9fe:a9fe")
	keys := map[string]string{"acme": d.createKey("acme", false), "beta": d.createKey("beta", false)}
	mark := marker()
	d.apply("projects:\n" + echoProject("hook-a", "acme", "mk-hook-a", echo, mark, "") + "    minReplicas: 1\n" +
		echoProject("hook-b", "beta", "mk-hook-b", echo, mark, "") + "    minReplicas: 1\n")
	start := func(team, modelKey, webhook string, startOnly bool) map[string]any {
		t.Helper()
		body := fmt.Sprintf(`{"apiKey":%q,"modelKey":%q,"startOnly":%t,"modelInputs":{},"webhook":%q}`, keys[team], modelKey, startOnly, webhook)
		status, r := do(t, "POST", d.base+"/start/v4", nil, body)
		if status != 200 || r["callID"] == "" {
			t.Fatalf("start for %s: HTTP %d %v", team, status, r)
		}
		return r
	}
	secret := func(team string) string {
		out, err := d.cli("team", "webhook-secret", team)
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(out)
	}

	slow := newHangingReceiver(t)
	for range 6 {
		start("acme", "mk-hook-a", slow.url, true)
	}
	for range 2 { // acme's share of the senders, both held
		select {
		case <-slow.arrived:
		case <-scaledAfter(60 * time.Second):
			t.Fatal(testenv.Waited(60*time.Second, "acme's webhooks to reach its receiver"))
		}
	}

	fast := newHookReceiver(t, nil)
	if r := start("beta", "mk-hook-b", fast.url, false); r["message"] != "success" {
		t.Fatalf("beta's call: %v", r)
	}
	m := fast.next(t, 45*time.Second)
	verifyStandardWebhook(t, secret("beta"), m)
	if err := testenv.VerifyStandardWebhook(secret("acme"), m.header, m.body, m.at); err == nil {
		t.Error("beta's message verifies with acme's secret")
	}
	if n := slow.mostHeld(); n != 2 {
		t.Errorf("acme's receiver held %d attempts at once, want acme's share, 2", n)
	}
	metrics := scrapeMetrics(t, d.base)
	if metrics[`inferd_webhook_team_sending{team="acme"}`] != 2 || metrics[`inferd_webhook_team_pending{team="acme"}`] != 6 {
		t.Errorf("acme: %v sending, %v pending; want 2 of 6", metrics[`inferd_webhook_team_sending{team="acme"}`],
			metrics[`inferd_webhook_team_pending{team="acme"}`])
	}

	// Both names are allowed by *.example, so the starts are accepted; the
	// addresses they resolve to are refused at the dial, and the messages
	// given up at once rather than retried.
	for _, host := range []string{"meta.example", "nat.example"} {
		start("beta", "mk-hook-b", "http://"+host+"/latest/meta-data/", true)
	}
	eventually(t, 30*time.Second, "beta's two metadata webhooks given up", func() bool {
		_, st := do(t, "GET", d.base+"/v1/status", map[string]string{"X-Service-API-Key": keys["beta"]}, "")
		w, _ := st["webhooks"].(map[string]any)
		return w != nil && w["gaveUp"] == 2.0
	})
	_, st := do(t, "GET", d.base+"/v1/status", map[string]string{"X-Service-API-Key": keys["beta"]}, "")
	if w := st["webhooks"].(map[string]any); w["retries"] != 0.0 || w["delivered"] != 1.0 {
		t.Errorf("beta's webhooks %v: the metadata ones were retried, not refused", w)
	}
	d.logs.waitFor(t, "169.254.169.254 is in 169.254.0.0/16", 10*time.Second)
}
